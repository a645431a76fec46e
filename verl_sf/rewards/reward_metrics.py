"""Prometheus counters of rewards left unscored and of suspected reward hacks, in the process's default registry.

A module of their own: verl may load a reward file by path (a second module object), and a metric
name can be registered only once per registry.
"""

from __future__ import annotations

from prometheus_client import Counter

SANDBOX_FAILURES = Counter(
    "verl_sf_reward_sandbox_failures", "Completions left unscored (reward None) because the sandbox could not run them",
    ["reward", "reason"])
TASK_ERRORS = Counter(
    "verl_sf_reward_task_errors", "Completions left unscored because the task's own tests or reference raised",
    ["reward"])
SUSPECTED_HACKS = Counter(
    "verl_sf_reward_suspected_hacks", "Completions that did something only an exploit of the reward does, by kind "
    "(a completion counts once under each kind it showed)", ["reward", "kind"])
