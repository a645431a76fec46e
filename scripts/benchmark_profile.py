#!/usr/bin/env python3
"""Where a stateless run's CPU goes under load: the whole machine sampled by `perf` while a real
`verl-sf serve` answers `/run_code` at a fixed concurrency (or, `--workload session`, calls in one
live session per caller; `--workload e2b`, E2B sandboxes' lives through plain HTTP: create, one
`/execute`, kill).

Each sample is put to the process it was taken in (the server, a zygote, a child still setting
up ahead of its job, a run, this load generator, kernel threads, idle) and to what that process
was doing, read from its kernel call chain: forking, exiting (mostly tearing down the address
space), a page fault (copy-on-write after a fork, mostly), mounts, namespaces, other system
calls, or user space.  Dividing by the runs answered while `perf` ran gives CPU milliseconds per
run (docs/performance.md, "Where a run's CPU goes").

Needs root (or kernel.perf_event_paranoid <= -1) and `perf` (Debian: `apt-get install linux-perf`).

Example:
  python scripts/benchmark_profile.py --concurrency 64 --seconds 6 --output docs/benchmarks/profile.json
  python scripts/benchmark_profile.py --workload session --concurrency 64
  python scripts/benchmark_profile.py --workload e2b --concurrency 1 --seconds 6
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import Any, Optional

# What a process was doing, from the first of these kernel functions found in its call chain.
ACTIVITIES = (
    ("fork", ("kernel_clone",)),
    ("exit", ("do_exit", "do_group_exit")),
    ("page fault", ("asm_exc_page_fault",)),
    ("mount", ("__x64_sys_mount", "__x64_sys_mount_setattr", "__x64_sys_umount", "path_mount")),
    ("namespaces", ("__x64_sys_unshare", "__x64_sys_setns")),
    ("other system calls", ("do_syscall_64",)),
)
Sample = tuple[str, int, list[str]]  # command name, pid, call chain (innermost first)


def parse(lines: Iterable[str]) -> list[Sample]:
    """`perf script -F comm,pid,ip,sym` output: a header line per sample, its frames indented below."""
    samples: list[Sample] = []
    current: Optional[Sample] = None
    for line in lines:
        if not line.strip():
            if current is not None:
                samples.append(current)
            current = None
        elif not line[0].isspace():
            comm, _, pid = line.strip().rpartition(" ")
            current = (comm.strip(), int(pid), [])
        elif current is not None:
            frame = line.split(None, 1)
            current[2].append(frame[1].strip() if len(frame) > 1 else "")
    if current is not None:
        samples.append(current)
    return samples


def role(comm: str, pid: int, roles: dict[int, str]) -> str:
    if pid == 0:
        return "idle"
    if pid in roles:
        return roles[pid]
    if comm == "verl-sf-ready":
        return "child setting up"
    if comm == "verl-sf-templat":
        return "template"
    if comm == "verl-sf-root":
        return "root helper"  # a rooted session's (an E2B sandbox's), forked as its child sets up
    if comm.startswith(("kworker", "ksoftirqd", "rcu", "kdamond", "kcompactd", "migration", "perf")):
        return "kernel threads"
    return "run"


def activity(chain: list[str]) -> str:
    for name, markers in ACTIVITIES:
        if any(frame in markers for frame in chain):
            return name
    return "user space"


def tally(samples: list[Sample], roles: dict[int, str], cpu_seconds: float, runs: int) -> dict[str, Any]:
    """Each role's share of the machine's CPU and its milliseconds per run, split by activity."""
    by_role: collections.Counter[str] = collections.Counter()
    by_activity: collections.Counter[tuple[str, str]] = collections.Counter()
    for comm, pid, chain in samples:
        who = role(comm, pid, roles)
        by_role[who] += 1
        by_activity[who, activity(chain)] += 1
    total = max(1, len(samples))
    per_run = cpu_seconds * 1000 / max(1, runs)
    return {who: {"share": count / total, "ms_per_run": per_run * count / total,
                  "activities": {what: {"share": n / total, "ms_per_run": per_run * n / total}
                                 for (owner, what), n in by_activity.most_common() if owner == who}}
            for who, count in by_role.most_common()}


def zygotes_of(server_pid: int) -> list[int]:
    """The server's zygotes: interpreters below it started from the zygote's bootstrap whose parent
    is not one (their children, ready or running, have the same command line)."""
    parents: dict[int, int] = {}
    interpreters = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                comm, _, rest = stat.read().rpartition(")")
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        parents[int(entry)] = int(rest.split()[1])
        if b"zygote.main import main" in command and not comm.endswith("(bwrap"):
            interpreters.add(int(entry))

    def below_server(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == server_pid:
                return True
        return False

    return [pid for pid in interpreters if parents[pid] not in interpreters and below_server(pid)]


async def load(url: str, code: str, concurrency: int, seconds: float, window: list[float],
               workload: str = "run_code") -> int:
    """Keep `concurrency` calls (or E2B lives) in flight for `seconds`; those answered inside `window` (start, end)."""
    import aiohttp

    answered = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def caller() -> None:
            nonlocal answered
            session_id = await _new_session(http, url) if workload == "session" else None
            while time.monotonic() < deadline:
                await (_e2b_life(http, url, code) if workload == "e2b" else _run(http, url, code, session_id))
                if window[0] <= time.monotonic() <= window[1]:
                    answered += 1
        await asyncio.gather(*(caller() for _ in range(concurrency)))
    return answered


async def _new_session(http: Any, url: str) -> str:
    async with http.post(url + "/sessions", json={"language": "python"}) as reply:
        body = await reply.json()
    if "session_id" not in body:
        raise RuntimeError(f"no session: {body}")
    return str(body["session_id"])


async def _run(http: Any, url: str, code: str, session_id: Optional[str] = None) -> None:
    request = {"code": code, "language": "python"}
    if session_id is not None:
        request["session_id"] = session_id
    async with http.post(url + "/run_code", json=request) as reply:
        body = await reply.json()
    if body.get("status") != "Success":
        raise RuntimeError(f"a run failed under load: {body}")


async def _e2b_life(http: Any, url: str, code: str) -> None:
    from bench.e2b_life import e2b_life  # scripts/ is on the path when this runs as a script

    events = await e2b_life(http, url, code, "benchmark")
    if any(event.get("type") == "error" for event in events):
        raise RuntimeError(f"an execution failed under load: {events}")


def profile(url: str, server_pid: int, code: str, concurrency: int, seconds: float, warmup: float,
            workload: str = "run_code") -> dict[str, Any]:
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("perf is not installed (Debian: apt-get install linux-perf)")
    roles = {server_pid: "server", os.getpid(): "load generator"}
    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "perf.data")
        window = [time.monotonic() + warmup, time.monotonic() + warmup + seconds]

        async def drive() -> int:
            task = asyncio.ensure_future(load(url, code, concurrency, warmup + seconds + 1, window, workload))
            await asyncio.sleep(warmup)
            roles.update((pid, "zygote") for pid in zygotes_of(server_pid))  # started by then: some on first use
            recorder = await asyncio.create_subprocess_exec(
                perf, "record", "-a", "-g", "-q", "-o", data, "--", "sleep", str(seconds),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, err = await recorder.communicate()
            if recorder.returncode != 0:
                raise SystemExit(f"perf record failed: {err.decode(errors='replace')}")
            return await task

        runs = asyncio.run(drive())
        script = subprocess.run([perf, "script", "-i", data, "-F", "comm,pid,ip,sym"], capture_output=True,
                                text=True, errors="replace", check=True)
    samples = parse(script.stdout.splitlines())
    cpus = len(os.sched_getaffinity(0))
    return {"workload": workload, "concurrency": concurrency, "seconds": seconds, "cpus": cpus, "runs": runs,
            "calls_per_second": runs / seconds, "cpu_ms_per_run": cpus * seconds * 1000 / max(1, runs),
            "samples": len(samples), "roles": tally(samples, roles, cpus * seconds, runs)}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['calls_per_second']:.0f} calls/s at c={result['concurrency']} on {result['cpus']} CPUs: "
             f"{result['cpu_ms_per_run']:.2f} ms of machine CPU per run ({result['samples']} samples)",
             f"{'where':38s} {'share':>7s} {'ms/run':>7s}"]
    for who, found in result["roles"].items():
        lines.append(f"{who:38s} {found['share']:7.1%} {found['ms_per_run']:7.2f}")
        if who in ("idle", "kernel threads"):
            continue
        for what, part in found["activities"].items():
            if part["share"] >= 0.004:
                lines.append(f"    {what:34s} {part['share']:7.1%} {part['ms_per_run']:7.2f}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long perf samples")
    parser.add_argument("--warmup", type=float, default=3.0, help="load before sampling starts")
    parser.add_argument("--code", default="print(2 + 2)")
    parser.add_argument("--workload", choices=("run_code", "session", "e2b"), default="run_code",
                        help="stateless runs, calls in a live session per caller, or E2B sandboxes' lives (create, "
                             "one execution, kill; a 'run' is a life)")
    parser.add_argument("--checkout", help="serve this checkout's verl_sf (a baseline) instead of the installed one")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra `verl-sf serve` argument, e.g. --server-arg=--slots=8; repeat")
    parser.add_argument("--output", help="write the result as JSON here")
    args = parser.parse_args(argv)
    from verl_sf.server.process import start_server_process, stop_server_process

    process, url = start_server_process(*args.server_arg, checkout=args.checkout)
    try:
        result = profile(url, process.pid, args.code, args.concurrency, args.seconds, args.warmup, args.workload)
    finally:
        stop_server_process(process)
    result["checkout"] = args.checkout or "installed"
    result["server_args"] = args.server_arg
    print(render(result))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
