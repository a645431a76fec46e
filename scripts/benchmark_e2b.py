#!/usr/bin/env python3
"""E2B API latency on `verl-sf serve`: the unmodified `e2b-code-interpreter` SDK's
`AsyncSandbox.create` + one `run_code` + `kill` (a sandbox's whole life, as open-r1 uses it), the
same three calls through plain HTTP (no SDK in the client), and the Sandbox Fusion API's
`/run_code` for the same code on the same server.

At concurrency C, each iteration starts C operations together and waits for all of them;
--iterations measured batches follow --warmup unmeasured ones.  Printed (and written with
--output): p50/p99 latency and throughput per level and API, and, for a server the script
started, what an idle sandbox holds (Pss over its processes, after one run_code) and how many
idle sandboxes fit in the default memory budget (`runs_memory_mb`, all runs' cap).

Examples:
  python scripts/benchmark_e2b.py                      # starts a server, levels 1 and 64
  python scripts/benchmark_e2b.py --url http://127.0.0.1:8080 --concurrency 1 8 64 --iterations 10
  python scripts/benchmark_e2b.py --checkout /tmp/before --concurrency 1   # a server from another checkout
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

import aiohttp

from bench.e2b_life import e2b_life
from bench.memory import process_kb
from bench.server import served
from bench.session_memory import WHO_AM_I, _session_pids

CODE = "print(sum(i * i for i in range(1000)))"
EXPECTED = f"{sum(i * i for i in range(1000))}\n"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running verl-sf server (else the script starts one)")
    parser.add_argument("--checkout", metavar="DIR",
                        help="start the server from this checkout's verl_sf (a worktree of the commit before a "
                             "change, to compare on the same machine in the same run)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra `verl-sf serve` argument for the server the script starts; repeat")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 64], metavar="C")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured batches per level")
    parser.add_argument("--iterations", type=int, default=5, help="measured batches per level")
    parser.add_argument("--idle", type=int, default=32, help="idle sandboxes to measure the memory of (0: none)")
    parser.add_argument("--output", help="also write the results as JSON here")
    return parser.parse_args(argv)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def e2b_lifecycle() -> None:
    from e2b_code_interpreter import AsyncSandbox

    sandbox = await AsyncSandbox.create(timeout=60)
    try:
        execution = await sandbox.run_code(CODE)
        if "".join(execution.logs.stdout) != EXPECTED:
            raise RuntimeError(f"wrong output from run_code: {execution}")
    finally:
        await sandbox.kill()


def e2b_http_lifecycle(session: aiohttp.ClientSession, url: str) -> Callable[[], Awaitable[None]]:
    """The same life through plain HTTP, as the SDK sends it (#38 measures it so): `POST /v2/sandboxes`,
    `POST /execute` to the code interpreter's port, `DELETE /sandboxes/{id}`; no SDK in the client."""
    async def call() -> None:
        events = await e2b_life(session, url, CODE, os.environ["E2B_API_KEY"])
        stdout = "".join(event["text"] for event in events if event.get("type") == "stdout")
        if stdout != EXPECTED:
            raise RuntimeError(f"wrong output from /execute: {events}")
    return call


def sandbox_fusion_call(session: aiohttp.ClientSession, url: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        async with session.post(url + "/run_code", json={"code": CODE, "language": "python"}) as response:
            body = await response.json()
        if body.get("status") != "Success" or body["run_result"]["stdout"] != EXPECTED:
            raise RuntimeError(f"wrong answer from /run_code: {body}")
    return call


async def measure(operation: Callable[[], Awaitable[None]], concurrency: int, warmup: int,
                  iterations: int) -> dict[str, Any]:
    async def timed() -> float:
        started = time.perf_counter()
        await operation()
        return time.perf_counter() - started

    latencies: list[float] = []
    wall = 0.0
    for batch in range(warmup + iterations):
        started = time.perf_counter()
        results = await asyncio.gather(*[timed() for _ in range(concurrency)])
        if batch >= warmup:
            wall += time.perf_counter() - started
            latencies.extend(results)
    return {"concurrency": concurrency, "calls": len(latencies), "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * percentile(latencies, 0.99), "throughput_per_s": len(latencies) / wall}


async def idle_memory(count: int, server_pid: int) -> dict[str, Any]:
    """Open `count` sandboxes, one run_code each, let them idle, and sum each one's Pss (MiB)."""
    from e2b_code_interpreter import AsyncSandbox

    from verl_sf.executor.config import default_runs_memory_mb

    sandboxes = await asyncio.gather(*[AsyncSandbox.create(timeout=120) for _ in range(count)])
    try:
        executions = await asyncio.gather(*[sandbox.run_code(WHO_AM_I) for sandbox in sandboxes])
        await asyncio.sleep(1.0)
        pss = []
        for execution in executions:
            namespace, group = "".join(execution.logs.stdout).split()
            pids = _session_pids(server_pid, int(namespace), group)
            if pids:
                pss.append(sum(process_kb(pid) for pid in pids) / 1024)
    finally:
        await asyncio.gather(*[sandbox.kill() for sandbox in sandboxes])
    budget = default_runs_memory_mb()
    median = statistics.median(pss) if pss else None
    return {"sandboxes": count, "measured": len(pss), "pss_mib_median": median, "pss_mib_max": max(pss, default=None),
            "runs_memory_mb": budget, "idle_sandboxes_in_budget": int(budget / median) if median else None}


async def run(args: argparse.Namespace, url: str, server_pid: Optional[int]) -> dict[str, Any]:
    os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=os.environ.get("E2B_API_KEY") or "bench")
    rows = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        for concurrency in args.concurrency:
            for api, operation in (("e2b create+run_code+kill", e2b_lifecycle),
                                   ("e2b the same, plain HTTP", e2b_http_lifecycle(session, url)),
                                   ("sandbox-fusion /run_code", sandbox_fusion_call(session, url))):
                row = {"api": api, **await measure(operation, concurrency, args.warmup, args.iterations)}
                print(f"{api:28s} C={concurrency:<4d} p50 {row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms  "
                      f"{row['throughput_per_s']:7.1f}/s  ({row['calls']} calls)", flush=True)
                rows.append(row)
    memory = None
    if args.idle and server_pid is not None:
        memory = await idle_memory(args.idle, server_pid)
    if memory is not None and memory["measured"]:
        print(f"idle sandbox: Pss median {memory['pss_mib_median']:.1f} MiB (max {memory['pss_mib_max']:.1f}, "
              f"{memory['measured']}/{memory['sandboxes']} measured); {memory['idle_sandboxes_in_budget']} fit in "
              f"runs_memory_mb={memory['runs_memory_mb']}", flush=True)
    return {"results": rows, "idle_memory": memory}


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    with served(args.url, args.server_arg, args.checkout) as (url, server_pid):
        measured = asyncio.run(run(args, url, server_pid))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"code": CODE, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                       "server_args": args.server_arg, "checkout": args.checkout, "warmup": args.warmup,
                       "iterations": args.iterations,
                       **measured}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
