"""Daytona's own guides, unchanged but for DAYTONA_API_URL, against `verl-sf serve`.

- "TRL + Daytona GRPO" (guides/python/reinforcement-learning/trl/train.py): a pool of sandboxes made
  with `daytona.create()`, completions evaluated with `code_interpreter.run_code(code, timeout=1)`
  (DaytonaTimeoutError is a failed completion), the rewards its `reward_func` computes, cleanup by
  `sandbox.delete()`.  Its calls are reproduced here; the rewards must be exactly what that logic
  gives for completions whose outcome is known.
- The verl-retool guide's `CustomDaytonaSandboxTool` (tests/daytona_retool_tool.py), loaded through
  verl 0.9's tool registry and driven as verl's agent loop drives a tool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from daytona import AsyncDaytona, AsyncSandbox, DaytonaTimeoutError
from verl.tools.tool_registry import initialize_tools_from_config

from tests.server_fixtures import ServerHandle, daytona_env, server_for_sdk

KEY = "daytona-guides-key"
MAX_TIMEOUT_SECONDS = 1  # train.py's per-completion limit
POOL = 32

SORT_PROMPT = '''def sort_numbers(xs: list[int]) -> list[int]:
    """Sort a list of integers in ascending order."""
'''
MAX_SUB_PROMPT = '''def max_subarray_sum(xs: list[int]) -> int:
    """The largest sum of a contiguous, non-empty sub-list."""
'''
TASKS: dict[str, dict[str, Any]] = {
    SORT_PROMPT: {"func_name": "sort_numbers", "reference": "sorted",
                  "banned_patterns": ["sorted(", ".sort(", "heapq", "import ", "__import__"],
                  "tests": ["[]", "[1, 3, 2]", "[random.randint(-1000, 1000) for _ in range(200)]",
                            "[random.randint(-100, 100) for _ in range(1000)]",
                            "list(range(0, 100)) + list(range(200, 100, -1)) + list(range(200, 300))"]},
    MAX_SUB_PROMPT: {"func_name": "max_subarray_sum", "reference": "_kadane", "banned_patterns": [],
                     "tests": ["[1]", "[-2, 1, -3, 4, -1, 2, 1, -5, 4]", "[-3, -1, -2]",
                               "[random.randint(-50, 50) for _ in range(300)]"]},
}
QUICKSORT = """    if len(xs) <= 1:
        return xs
    pivot = xs[len(xs) // 2]
    return sort_numbers([x for x in xs if x < pivot]) + [x for x in xs if x == pivot] + \\
        sort_numbers([x for x in xs if x > pivot])

print(sort_numbers([3, 1, 2]))"""
KADANE = """    best = current = xs[0]
    for x in xs[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best"""
# (completion, prompt, the reward train.py's reward_func gives it)
CASES: list[tuple[str, str, float]] = [
    (QUICKSORT, SORT_PROMPT, 1.0),
    ("    return list(xs)", SORT_PROMPT, 1 / 5),  # only [] is sorted already
    ("    return sorted(xs)", SORT_PROMPT, -1.0),  # a banned pattern: never run
    ("    while True:\n        pass", SORT_PROMPT, -1.0),  # past MAX_TIMEOUT_SECONDS
    ("    return xs[", SORT_PROMPT, -1.0),  # a syntax error
    ("", SORT_PROMPT, -1.0),  # nothing to run
    ("    raise SystemExit(0)", SORT_PROMPT, -1.0),  # ends the cell without a result line
    (KADANE, MAX_SUB_PROMPT, 1.0),
    ("    return sum(xs)", MAX_SUB_PROMPT, 1 / 4),  # right only for [1]
    ("    return max(xs)", MAX_SUB_PROMPT, 2 / 4),  # right for [1] and [-3, -1, -2]
]


def sanitize_completion(text: str) -> str:
    kept = []
    for line in text.splitlines():
        if line and not line.startswith("    "):
            break
        kept.append(line)
    return "\n".join(kept).rstrip()


def has_banned_pattern(text: str, task: dict[str, Any]) -> bool:
    return any(p.lower() in text.lower() for p in task.get("banned_patterns", []))


def build_test_harness(task: dict[str, Any], body: str, prompt: str) -> str:
    tests = ",\n        ".join(task["tests"])
    return f"""{prompt}
{body}

import json
import random
random.seed(0)

def _kadane(xs):
    max_sum = current = xs[0]
    for x in xs[1:]:
        current = max(x, current + x)
        max_sum = max(max_sum, current)
    return max_sum

def _run_tests():
    tests = (
        {tests},
    )
    results = []
    for xs in tests:
        try:
            results.append({task["func_name"]}(xs.copy()) == {task["reference"]}(xs.copy()))
        except Exception:
            results.append(False)
    print(json.dumps({{"results": results}}))

if __name__ == "__main__":
    _run_tests()
"""


def fail_result(num_tests: int) -> dict[str, Any]:
    return {"no_error": False, "num_passed": 0, "num_tests": num_tests}


async def evaluate_single_completion_async(sandbox: AsyncSandbox, raw_completion: str, prompt: str) -> dict[str, Any]:
    task = TASKS[prompt]
    body = sanitize_completion(raw_completion)
    if not body.strip() or has_banned_pattern(body, task):
        return fail_result(len(task["tests"]))
    try:
        response = await sandbox.code_interpreter.run_code(build_test_harness(task, body, prompt),
                                                           timeout=MAX_TIMEOUT_SECONDS)
    except DaytonaTimeoutError:
        return fail_result(len(task["tests"]))
    if response.error is not None or not response.stdout.strip():
        return fail_result(len(task["tests"]))
    try:
        correct = json.loads(response.stdout.strip().splitlines()[-1]).get("results", [])
    except ValueError:
        return fail_result(len(task["tests"]))
    return {"no_error": True, "num_passed": sum(bool(x) for x in correct), "num_tests": len(correct)}


async def _create_sandbox_pool_async(daytona: AsyncDaytona, n: int) -> list[AsyncSandbox]:
    return list(await asyncio.gather(*(daytona.create() for _ in range(n))))


async def _evaluate_batch_async(pool: list[AsyncSandbox], completions: list[str], prompts: list[str]
                                ) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(evaluate_single_completion_async(pool[i % len(pool)], c, p)
                                       for i, (c, p) in enumerate(zip(completions, prompts, strict=True)))))


async def _cleanup_sandbox_pool_async(pool: list[AsyncSandbox]) -> list[Any]:
    return list(await asyncio.gather(*(s.delete() for s in pool), return_exceptions=True))


def rewards_of(stats_list: list[dict[str, Any]]) -> list[float]:
    """train.py's reward_func, given its batch evaluation's results."""
    rewards = []
    for s in stats_list:
        if not s["no_error"]:
            rewards.append(-1.0)
        elif s["num_tests"] == 0:
            rewards.append(0.0)
        else:
            rewards.append(s["num_passed"] / s["num_tests"])
    return rewards


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with server_for_sdk(daytona_env(KEY), "--preload", "") as handle:
        yield handle


async def test_trl_grpo_reward_path(server: ServerHandle) -> None:
    daytona = AsyncDaytona()
    try:
        pool = await _create_sandbox_pool_async(daytona, POOL)
        assert len({s.id for s in pool}) == POOL
        # Three GRPO steps' worth of completions: 96 over 32 sandboxes, every case several times.
        batch = [CASES[i % len(CASES)] for i in range(3 * POOL)]
        for _ in range(2):  # the pool is reused from step to step, as in training
            stats = await _evaluate_batch_async(pool, [c for c, _, _ in batch], [p for _, p, _ in batch])
            assert rewards_of(stats) == [reward for _, _, reward in batch]
        errors = await _cleanup_sandbox_pool_async(pool)
        assert errors == [None] * POOL
        assert [s async for s in daytona.list()] == []
    finally:
        await daytona.close()


async def test_verl_retool_guide_tool_through_verls_registry(server: ServerHandle, tmp_path: Path) -> None:
    config = {"tools": [{"class_name": "tests.daytona_retool_tool.DaytonaRetoolTool",
                         "config": {"type": "native", "rate_limit": 16, "default_timeout": 30},
                         "tool_schema": {"type": "function", "function": {
                             "name": "code_interpreter", "description": "Run Python code in a Daytona sandbox.",
                             "parameters": {"type": "object", "required": ["code"], "properties": {
                                 "code": {"type": "string", "description": "The Python code to execute."}}}}}}]}
    path = tmp_path / "retool_daytona.yaml"
    path.write_text(yaml.safe_dump(config))
    (tool,) = initialize_tools_from_config(str(path))
    assert tool.name == "code_interpreter"

    async def trajectory(n: int) -> list[str]:
        instance_id, _ = await tool.create()
        try:
            first, reward, metrics = await tool.execute(instance_id, {"code": f"total = {n}\nprint(total * 2)"})
            assert reward == 0.0 and not metrics["had_error"]
            second, _, _ = await tool.execute(instance_id, {"code": "import os\nprint(total + 1, os.environ['K'])",
                                                            "envs": {"K": "v"}})
            failing, _, metrics = await tool.execute(instance_id, {"code": "print('before')\n1 / 0"})
            assert metrics["had_error"]
            assert await tool.calc_reward(instance_id) == [first.text, second.text, failing.text]
            return [first.text, second.text, failing.text]
        finally:
            await tool.release(instance_id)

    try:
        outputs = await asyncio.gather(*(trajectory(n) for n in range(24)))
    finally:
        await tool.close()
    for n, (first, second, failing) in enumerate(outputs):
        assert first == f"{n * 2}\n" and second == f"{n + 1} v\n"
        # The guide's text: stdout, then `name: value`, then the traceback (IPython's, as a Jupyter kernel's).
        assert failing.startswith("before\nZeroDivisionError: division by zero\n")
        assert "Traceback (most recent call last)" in failing and "----> 2 1 / 0" in failing
    daytona = AsyncDaytona()
    try:
        assert [s async for s in daytona.list()] == []
    finally:
        await daytona.close()
