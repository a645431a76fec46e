"""The reference run: the task alone, no candidate code; its inputs and the reference's answers, as plain data."""

from __future__ import annotations

import json
from typing import Any

from .codec import NotPlainData, _emit, encode


def _kadane(xs: list) -> Any:
    """The TRL + Daytona example's reference for `max_subarray_sum`."""
    best = running = xs[0]
    for x in xs[1:]:
        running = max(x, running + x)
        best = max(best, running)
    return best


def reference_run(spec_json: str) -> None:
    """Print `{"inputs": [...], "expected": [...]}` (encoded), or `{"task_error": ...}` if the task's code fails."""
    import copy
    import random

    spec = json.loads(spec_json)
    random.seed(0)
    namespace: dict[str, Any] = {"random": random, "_kadane": _kadane}
    encoded: dict[str, Any]
    try:
        exec(spec["reference_code"], namespace)
        reference = eval(spec["reference"], namespace)
        inputs = [eval(test, namespace) for test in spec["tests"]]
        expected = [reference(copy.deepcopy(value)) for value in inputs]
        encoded = {"inputs": [encode(value) for value in inputs], "expected": [encode(value) for value in expected]}
    except NotPlainData as exc:
        encoded = {"task_error": f"the task's inputs and answers must be plain data, found a {exc}"}
    except Exception as exc:
        encoded = {"task_error": f"{type(exc).__name__}: {exc}"}
    _emit(1, encoded)
