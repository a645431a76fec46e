#!/usr/bin/env python3
"""Time one batch of the TRL + Daytona example's rewards: verl-sf against a plain-subprocess baseline, same run.

The batch is the example's step: 500 completions over its two tasks, bodies in known proportions (correct, wrong,
banned, error, endless loop).  verl-sf evaluates it with `CodeTestReward` (the server the script starts, one given by
--sandbox-url, or --backend local); the baseline runs the same harness per completion as `python -c` in a plain
subprocess (no sandbox) with the same time-out and the same number in flight, and judges it the same way.  Both
get each task's reference (its inputs and answers) before the clock starts.  Each contender's rewards are checked
against what each body must score; the script fails if verl-sf misscores any.

Examples:
  nice python scripts/benchmark_rewards.py                       # 500 completions, server with one slot per core x2
  python scripts/benchmark_rewards.py --sandbox-url http://127.0.0.1:8080 --concurrency 128
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import platform
import signal
import sys
import time
from typing import Optional

from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus
from verl_sf.rewards.code_harness import (
    Candidate,
    CodeTask,
    TaskReference,
    candidate_code,
    has_banned_pattern,
    parse_task,
    reference_code,
)
from verl_sf.rewards.code_reward import FAILURE_REWARD, CodeTestReward, candidate_of, judge, judge_reference
from verl_sf.rewards.example_tasks import EXAMPLE_TASKS
from verl_sf.server.process import start_server_process, stop_server_process

BODIES: dict[str, dict[str, str]] = {
    "sorting": {
        "correct": ("    out = []\n    for x in xs:\n        i = len(out)\n        while i > 0 and out[i - 1] > x:\n"
                    "            i -= 1\n        out.insert(i, x)\n    return out\n"),
        "wrong": "    return list(xs)\n",
        "banned": "    return sorted(xs)\n",
        "error": "    return [x for x in xs\n",
        "endless": "    while True:\n        pass\n",
    },
    "max_subarray": {
        "correct": ("    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n"
                    "        best = max(best, cur)\n    return best\n"),
        "wrong": "    return sum(xs)\n",
        "error": "    return max(xs[0], sum(xs)\n",
        "endless": "    while True:\n        pass\n",
    },
}
MUST_SCORE = {"correct": 1.0, "banned": -1.0, "error": -1.0, "endless": -1.0}  # "wrong" passes some tests, not all
# Share of each body in the batch (the example's step is 500 completions).
MIX = {"correct": 0.50, "wrong": 0.20, "banned": 0.10, "error": 0.15, "endless": 0.05}


def build_batch(size: int) -> tuple[list[str], list[str], list[str]]:
    """(task names, completions, kinds): kinds in MIX's proportions, alternating the two tasks (banned bodies
    go to the sorting task, the only one with banned patterns)."""
    kinds = [kind for kind, share in MIX.items() for _ in range(round(share * size))][:size]
    kinds += ["correct"] * (size - len(kinds))
    names = [name if kind in BODIES[name] else "sorting"
             for kind, name in zip(kinds, itertools.cycle(EXAMPLE_TASKS))]
    completions = [BODIES[name][kind] for name, kind in zip(names, kinds, strict=True)]
    return names, completions, kinds


async def python_c(code: str, timeout_s: float) -> RunCodeResponse:
    """`python -c code`, killed at the time-out, as a Sandbox Fusion response (so the reward's judge reads it)."""
    # A session of its own: the harness forks, and a time-out must end its child too.
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, start_new_session=True)
    status = CommandRunStatus.Finished
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        status, stdout, stderr = CommandRunStatus.TimeLimitExceeded, b"", b""
        with contextlib.suppress(ProcessLookupError):  # not reaped yet, so the group is still ours
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    run = CommandRunResult(status=status, return_code=proc.returncode, stdout=stdout.decode(errors="replace"),
                           stderr=stderr.decode(errors="replace"))
    ok = status is CommandRunStatus.Finished and proc.returncode == 0
    return RunCodeResponse(status=RunStatus.Success if ok else RunStatus.Failed, run_result=run)


async def subprocess_references(tasks: list[CodeTask]) -> dict[CodeTask, TaskReference]:
    references = {}
    for task in set(tasks):
        reference = judge_reference(await python_c(reference_code(task), 60), len(task.tests))
        if not isinstance(reference, TaskReference):
            raise SystemExit(f"the baseline could not run a task's reference: {reference.detail}")
        references[task] = reference
    return references


async def subprocess_rewards(candidates: list[Candidate], tasks: list[CodeTask],
                             references: dict[CodeTask, TaskReference], timeout_s: float,
                             concurrency: int) -> list[Optional[float]]:
    """The naive way: every harness in a fresh `python -c`, killed at the time-out; same scoring rules."""
    gate = asyncio.Semaphore(concurrency)

    async def one(candidate: Candidate, task: CodeTask) -> Optional[float]:
        if not candidate.code.strip() or has_banned_pattern(candidate.code, task.banned_patterns):
            return FAILURE_REWARD
        async with gate:
            response = await python_c(candidate_code(task, candidate, references[task]), timeout_s)
        return judge(response, references[task]).reward

    return list(await asyncio.gather(*(one(c, t) for c, t in zip(candidates, tasks, strict=True))))


def scoring(rewards: list[Optional[float]], kinds: list[str]) -> dict[str, object]:
    """Rewards against what each body must score: `misscored` counts rewards that are wrong for the body
    (e.g. a correct one timed out while its interpreter started), `unscored` the None ones."""
    def misscored(kind: str, reward: float) -> bool:
        return reward != MUST_SCORE[kind] if kind in MUST_SCORE else not 0.0 <= reward < 1.0

    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for reward, kind in zip(rewards, kinds, strict=True):
        if reward is not None:
            by_kind[kind].append(reward)
    return {"misscored": sum(r is not None and misscored(k, r) for r, k in zip(rewards, kinds, strict=True)),
            "unscored": rewards.count(None),
            "mean_reward_by_kind": {kind: round(sum(v) / len(v), 4) for kind, v in sorted(by_kind.items())}}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--completions", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=1.0, help="per-completion time-out (s), as the example")
    parser.add_argument("--concurrency", type=int, default=64, help="harness runs in flight, both contenders")
    parser.add_argument("--sandbox-url", help="a running server; without it the script starts one")
    parser.add_argument("--backend", choices=("http", "local"), default="http")
    parser.add_argument("--server-workers", type=int, default=2 * (os.cpu_count() or 2))
    parser.add_argument("--output", help="also write the summary JSON here")
    args = parser.parse_args(argv)

    names, completions, kinds = build_batch(args.completions)
    tasks = {name: parse_task(name, spec) for name, spec in EXAMPLE_TASKS.items()}
    batch_tasks = [tasks[name] for name in names]
    prompts = [task.prompt for task in batch_tasks]

    server, url = None, args.sandbox_url
    if args.backend == "http" and url is None:
        server, url = start_server_process("--workers", str(args.server_workers))
    try:
        backend_kwargs = {"backend": "local", "local_options": {"workers": args.server_workers}} \
            if args.backend == "local" else {"sandbox_url": url}
        with CodeTestReward(EXAMPLE_TASKS, timeout_s=args.timeout, max_concurrency=args.concurrency,
                            progress=False, **backend_kwargs) as reward:
            reward(prompts[:4], completions[:4])  # connections (or the local executor) up before timing
            start = time.perf_counter()
            verl_sf_rewards = reward(prompts, completions)
            verl_sf_wall = time.perf_counter() - start
            failures = reward.sandbox_failures
    finally:
        if server is not None:
            stop_server_process(server)

    references = asyncio.run(subprocess_references(batch_tasks))
    start = time.perf_counter()
    baseline_rewards = asyncio.run(subprocess_rewards([candidate_of(c) for c in completions], batch_tasks,
                                                      references, args.timeout, args.concurrency))
    baseline_wall = time.perf_counter() - start

    summary = {
        "completions": len(completions), "mix": MIX, "timeout_s": args.timeout, "concurrency": args.concurrency,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "verl_sf": {"backend": args.backend, "wall_s": round(verl_sf_wall, 3),
                    "completions_per_s": round(len(completions) / verl_sf_wall, 1),
                    "sandbox_failures": failures, **scoring(verl_sf_rewards, kinds)},
        "subprocess": {"wall_s": round(baseline_wall, 3),
                       "completions_per_s": round(len(completions) / baseline_wall, 1),
                       **scoring(list(baseline_rewards), kinds)},
        "speedup": round(baseline_wall / verl_sf_wall, 2),
        "same_rewards": verl_sf_rewards == baseline_rewards,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as out:
            out.write(text + "\n")
    if summary["verl_sf"]["misscored"]:
        raise SystemExit("verl-sf gave some completions a reward their body does not earn")


if __name__ == "__main__":
    main()
