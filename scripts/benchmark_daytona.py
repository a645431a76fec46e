#!/usr/bin/env python3
"""Daytona API throughput on `verl-sf serve`, measured as the Daytona verl-retool guide's
benchmark_tool_backends.py measures `--backend daytona`, beside the Sandbox Fusion API's
`/run_code` for the same code on the same server in the same run.

The guide's method: create max(--concurrency) sandboxes at once (`AsyncDaytona.create` with its
tool's CreateSandboxFromSnapshotParams; p50_create_s and the rest are reported); then per scenario
and level C, batches of C `sandbox.code_interpreter.run_code(code, timeout=...)` calls over the
first C sandboxes (--warmup unmeasured batches, then --iterations measured ones; throughput =
measured calls / summed batch wall time); then every sandbox is deleted at once.  The
/run_code rows use the same batches with one POST per call.  A call counts as a success only
with the scenario's expected output (for runtime_error: the error, reported as an error).

Examples:
  python scripts/benchmark_daytona.py                   # starts a server; levels 1 8 32 64 128
  python scripts/benchmark_daytona.py --url http://127.0.0.1:8080 --scenarios simple_stdout --output d.json
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

from bench.runner import percentile
from bench.scenarios import SCENARIOS, Scenario
from bench.server import served

GUIDE_SCENARIOS = ("simple_stdout", "cpu_bound_stdout", "runtime_error")
Call = Callable[[int, Scenario], Awaitable[bool]]  # (virtual client, scenario) -> success


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running verl-sf server (else the script starts one)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra `verl-sf serve` argument for the server the script starts; repeat")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 64, 128], metavar="C")
    parser.add_argument("--scenarios", nargs="+", default=list(GUIDE_SCENARIOS), choices=GUIDE_SCENARIOS)
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured batches per level (the guide's 3)")
    parser.add_argument("--iterations", type=int, default=20, help="measured batches per level (the guide's 20)")
    parser.add_argument("--timeout", type=int, default=30, help="each run_code's timeout, s (the guide's default)")
    parser.add_argument("--output", help="also write the results as JSON here")
    return parser.parse_args(argv)


async def measure(call: Call, scenario: Scenario, concurrency: int, warmup: int, iterations: int) -> dict[str, Any]:
    async def timed(client: int) -> tuple[float, bool]:
        started = time.perf_counter()
        try:
            ok = await call(client, scenario)
        except Exception:  # the guide counts an exception as a failed call
            ok = False
        return time.perf_counter() - started, ok

    latencies: list[float] = []
    successes = 0
    wall = 0.0
    for batch in range(warmup + iterations):
        started = time.perf_counter()
        results = await asyncio.gather(*(timed(client) for client in range(concurrency)))
        if batch >= warmup:
            wall += time.perf_counter() - started
            latencies.extend(latency for latency, _ in results)
            successes += sum(ok for _, ok in results)
    return {"scenario": scenario.name, "concurrency": concurrency, "calls": len(latencies),
            "failures": len(latencies) - successes, "p50_latency_s": statistics.median(latencies),
            "p95_latency_s": percentile(latencies, 0.95), "throughput_calls_per_s": len(latencies) / wall}


async def create_pool(count: int) -> tuple[Any, list[Any], dict[str, Any]]:
    """The guide's setup: `count` sandboxes created at once, each timed."""
    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams

    daytona = AsyncDaytona()

    async def create_one(index: int) -> tuple[Any, float]:
        started = time.perf_counter()
        params = CreateSandboxFromSnapshotParams(name=f"verl-daytona-bench-{os.getpid()}-{index}", language="python",
                                                 labels={"framework": "verl", "backend": "daytona"},
                                                 auto_stop_interval=15, auto_delete_interval=30)
        sandbox = await daytona.create(params, timeout=60)
        return sandbox, time.perf_counter() - started

    started = time.perf_counter()
    created = await asyncio.gather(*(create_one(i) for i in range(count)))
    wall = time.perf_counter() - started
    times = [elapsed for _, elapsed in created]
    setup = {"sandbox_count": count, "p50_create_s": statistics.median(times),
             "p95_create_s": percentile(times, 0.95), "max_create_s": max(times),
             "mean_create_s": statistics.fmean(times), "total_wall_s": wall}
    return daytona, [sandbox for sandbox, _ in created], setup


def daytona_call(pool: list[Any], timeout: int) -> Call:
    async def call(client: int, scenario: Scenario) -> bool:
        result = await pool[client % len(pool)].code_interpreter.run_code(scenario.code, timeout=timeout)
        if scenario.expects_error:
            return result.error is not None and scenario.expected in result.error.name
        return result.error is None and scenario.expected in result.stdout
    return call


def sandbox_fusion_call(session: aiohttp.ClientSession, url: str, timeout: int) -> Call:
    async def call(client: int, scenario: Scenario) -> bool:
        request = {"code": scenario.code, "language": "python", "run_timeout": timeout}
        async with session.post(url + "/run_code", json=request) as response:
            body = await response.json()
        run = body.get("run_result") or {}
        if scenario.expects_error:
            return body.get("status") == "Failed" and scenario.expected in (run.get("stderr") or "")
        return body.get("status") == "Success" and scenario.expected in (run.get("stdout") or "")
    return call


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    os.environ.update(DAYTONA_API_URL=f"{url}/api", DAYTONA_API_KEY=os.environ.get("DAYTONA_API_KEY") or "bench")
    daytona, pool, setup = await create_pool(max(args.concurrency))
    print(f"setup: {setup['sandbox_count']} sandboxes, p50_create_s {setup['p50_create_s']:.3f}, "
          f"p95 {setup['p95_create_s']:.3f}, wall {setup['total_wall_s']:.2f} s", flush=True)
    rows = []
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
            apis = (("daytona run_code", daytona_call(pool, args.timeout)),
                    ("sandbox-fusion /run_code", sandbox_fusion_call(session, url, args.timeout)))
            for name in args.scenarios:
                for concurrency in args.concurrency:
                    for api, call in apis:
                        row = {"api": api, **await measure(call, SCENARIOS[name], concurrency, args.warmup,
                                                           args.iterations)}
                        print(f"{api:26s} {name:17s} C={concurrency:<4d} p50 {row['p50_latency_s'] * 1000:8.1f} ms  "
                              f"p95 {row['p95_latency_s'] * 1000:8.1f} ms  {row['throughput_calls_per_s']:7.1f}/s  "
                              f"fail {row['failures']}/{row['calls']}", flush=True)
                        rows.append(row)
    finally:
        started = time.perf_counter()
        await asyncio.gather(*(sandbox.delete() for sandbox in pool))
        teardown_s = time.perf_counter() - started
        await daytona.close()
    print(f"teardown: {len(pool)} sandboxes deleted in {teardown_s:.2f} s", flush=True)
    return {"setup": setup, "teardown_wall_s": teardown_s, "results": rows}


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    with served(args.url, args.server_arg) as (url, _):
        measured = asyncio.run(run(args, url))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                       "server_args": args.server_arg, "warmup": args.warmup, "iterations": args.iterations,
                       "timeout": args.timeout, **measured}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
