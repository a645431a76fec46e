"""GSM8K: the answer is the number after the last `#### ` marker.

Same contract as verl's gsm8k scorer (strict `#### <answer>` format, 1.0 / 0.0), but numbers
are compared by value, so `#### 1,000`, `#### $1000` and `#### 1000.00` all match `1000`.
"""

from __future__ import annotations

import re
from typing import Optional

from verl_sf.rewards.numbers import parse_number

# A number, allowing a sign, a currency sign, thousands commas, decimals and a/b fractions.
_ANSWER_RE = re.compile(r"####\s*(-?\$?\s?-?[0-9][0-9,]*(?:\.[0-9]+)?(?:/[0-9]+)?|-?\$?\s?-?\.[0-9]+)")


def extract_answer(text: str) -> Optional[str]:
    """The text of the last `#### <number>` answer, or None if the model gave none."""
    matches = _ANSWER_RE.findall(text)
    return matches[-1].strip() if matches else None


def ground_truth_value(ground_truth: str) -> str:
    """Accept either the bare answer ("72") or a full gsm8k solution ending in `#### 72`."""
    if "####" in ground_truth:
        answer = extract_answer(ground_truth)
        if answer is None:
            raise ValueError(f"gsm8k ground truth has '####' but no number after it: {ground_truth[-80:]!r}")
        return answer
    return ground_truth.strip()


def compute_score(solution_str: str, ground_truth: str) -> dict:
    """{"score": 1.0 if the last `####` answer equals the ground truth else 0.0, "acc", "pred"}."""
    pred = extract_answer(solution_str)
    expected = parse_number(ground_truth_value(str(ground_truth)))
    if expected is None:
        raise ValueError(f"gsm8k ground truth {ground_truth!r} is not a number")
    correct = pred is not None and parse_number(pred) == expected
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": pred or ""}
