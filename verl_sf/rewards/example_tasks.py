"""The two tasks of the TRL + Daytona GRPO example, in its `TASKS` shape (for the script, benchmark and tests).

A base model continues each prompt with the function body; the sorting task bans the shortcuts its prompt
promises not to use.
"""

from __future__ import annotations

SORTING_PROMPT = '''# I've been fiddling with different ways to sort numbers in Python.
# At first I just used sorted() and list.sort(), but then I decided to try
# my hand at writing some original sorting functions. And I succeeded!
# I don't call sorted(), list.sort(), heapq, or use any imports here - just plain
# Python and an original algorithm.
def sort_numbers(xs: list[int]) -> list[int]:
    """Sort a list of integers in ascending order.

    Args:
        xs: A list of integers to be sorted.

    Returns:
        A new list containing the same integers, sorted from smallest to largest.
    """
'''

MAX_SUBARRAY_PROMPT = '''# I've been exploring different ways to compute the maximum sum of a contiguous
# subarray in Python. At first I wrote a straightforward brute-force version
# with nested loops, but now I'm trying to come up with my own cleaner
# implementation. There are lots of possible approaches here, and this function
# is just my original take on the problem.
def max_subarray_sum(xs: list[int]) -> int:
    """Return the maximum sum of a non-empty contiguous subarray.

    Args:
        xs: A non-empty list of integers.

    Returns:
        The largest possible sum of any contiguous subarray of xs.
    """
'''

EXAMPLE_TASKS: dict[str, dict] = {
    "sorting": {
        "prompt": SORTING_PROMPT,
        "func_name": "sort_numbers",
        "banned_patterns": ["sorted(", ".sort(", "heapq", "import ", "__import__"],
        "tests": [
            "[]",
            "[1, 3, 2]",
            "[random.randint(-1000, 1000) for _ in range(200)]",
            "[random.randint(-100, 100) for _ in range(1000)]",
            "list(range(0, 100)) + list(range(200, 100, -1)) + list(range(200, 300))",
        ],
        "reference": "sorted",
    },
    "max_subarray": {
        "prompt": MAX_SUBARRAY_PROMPT,
        "func_name": "max_subarray_sum",
        "banned_patterns": [],
        "tests": [
            "[5]",
            "[-3]",
            "[-2, -3, -1, -4]",
            "[-2, 1, -3, 4, -1, 2, 1, -5, 4]",
            "[1, 2, 3, 4]",
            "[random.randint(-1000, 1000) for _ in range(200)]",
            "[random.randint(-100, 100) for _ in range(1000)]",
        ],
        "reference": "_kadane",
    },
}
