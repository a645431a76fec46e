"""Rule-based rewards with verl's `compute_score` signature.

Use as verl's custom reward function::

    reward.custom_reward_function.path=pkg://verl_sf.rewards
    reward.custom_reward_function.name=compute_score

The scorer is chosen from `data_source`; every scorer returns a dict with `score` (what
verl trains on), `acc` and `pred`, which verl logs and writes into the rollout dump.

Code-test rewards that run in the sandbox (TRL reward functions and verl's `compute_score`)
are `CodeTestReward`, see `verl_sf.rewards.code_reward`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from verl_sf.rewards import boxed, gsm8k
from verl_sf.rewards.code_reward import (
    CodeTask,
    CodeTaskError,
    CodeTestResult,
    CodeTestReward,
    Outcome,
    SandboxFailure,
)

Scorer = Callable[[str, str], dict]

SCORERS: dict[str, Scorer] = {"gsm8k": gsm8k.compute_score, "math": boxed.compute_score}

# data_source spellings (as written by the usual preprocessing scripts) -> scorer name.
_GSM8K_SOURCES = ("gsm8k",)
_MATH_SOURCES = ("math", "aime", "amc", "dapo", "retool", "olympiad", "boxed")


def scorer_for(data_source: str) -> str:
    """The scorer name for a data_source, e.g. "openai/gsm8k" -> "gsm8k", "aime_2024" -> "math"."""
    name = data_source.lower()
    if any(key in name for key in _GSM8K_SOURCES):
        return "gsm8k"
    if any(key in name for key in _MATH_SOURCES):
        return "math"
    raise ValueError(
        f"no reward for data_source {data_source!r}: expected one containing 'gsm8k' "
        f"or one of {list(_MATH_SOURCES)} (boxed math answers)"
    )


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Optional[dict] = None,
    **kwargs: Any,
) -> dict:
    """verl's custom_reward_function entry point; extra kwargs verl may pass are ignored."""
    return SCORERS[scorer_for(data_source)](solution_str, ground_truth)


__all__ = ["SCORERS", "CodeTask", "CodeTaskError", "CodeTestResult", "CodeTestReward", "Outcome", "SandboxFailure",
           "compute_score", "scorer_for"]
