#!/usr/bin/env python3
"""Benchmark the Ray execution pool and its cluster-wide limiter.

Two measurements, both on a local Ray instance this script starts (and stops):

1. limiter   grants+releases per second through `LimiterClient` (acquire, then release
             at once), from one client process and from several client actors, with the
             cap out of the way and with the cap binding (callers queue).  Goal >= 5,000/s.
2. e2e       calls/s against a `verl-sf serve` at concurrency C over three paths:
               direct     `HttpSandboxBackend.run_code` from this process (no pool);
               ray        the tool's default under Ray (`pool: ray`): the same call in this
                          process, under a permit of the cluster-wide limiter
                          (`verl_sf.tools.dispatch.RayLimiterDispatcher`, num_workers=rate_limit=C);
               ray_actor  `pool: ray_actor`: through an ExecutionWorker actor
                          (`init_execution_pool(num_workers=C, rate_limit=C)`).
             The pooled paths send what the tool sends (`run_request` + a BackendConfig).
             Each round runs every path once, back to back (the order rotates); a path's
             overhead is the median over rounds of its shortfall against direct in the
             same round, so load that shifts between rounds cancels out.  Also reported:
             median calls/s per path and the CPU each component (driver, pool actor,
             limiters, server, rest of Ray) spent per call.  Two workloads: `print(1)`
             (pure overhead) and a ~20 ms computation (a typical math tool call).
             Goal: <= 10% slower than direct.

Examples:
  python scripts/benchmark_pool.py                       # both, server started by the script
  python scripts/benchmark_pool.py --only limiter --limiter-seconds 10
  python scripts/benchmark_pool.py --only e2e --url http://127.0.0.1:8080 --concurrency 128
  python scripts/benchmark_pool.py --json outputs/pool_benchmark.json
  python scripts/benchmark_pool.py --only e2e --split-cpus   # server and client on separate cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import ray

from verl_sf.backends.config import HttpBackendConfig
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus
from verl_sf.pool import LimiterClient, init_execution_pool, shutdown_global_limiter
from verl_sf.server.process import start_server_process
from verl_sf.server.process import stop_server_process as stop_server
from verl_sf.tools.backend_calls import backend_for, close_backend, run_request
from verl_sf.tools.dispatch import RayLimiterDispatcher

BENCH_LIMITER = "verl-sf-benchmark-limiter"
WORKLOADS = {
    # Pure overhead: the sandbox does almost nothing, so every client-side cost shows.
    "print": "print(1)",
    # A typical math tool call: some tens of milliseconds of work in the sandbox.
    "compute": "print(sum(i * i for i in range(300_000)))",
}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["limiter", "e2e"], help="run one of the two measurements")
    parser.add_argument("--limiter-seconds", type=float, default=5.0, help="duration of each limiter scenario")
    parser.add_argument("--limiter-callers", type=int, default=256, help="concurrent acquire/release loops")
    parser.add_argument("--limiter-actors", type=int, default=4, help="client actors in the multi-process scenario")
    parser.add_argument("--url", help="a running verl-sf / Sandbox Fusion server (else one is started)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra `verl-sf serve` argument for the server the script starts; repeat")
    parser.add_argument("--concurrency", type=int, default=128, help="e2e calls in flight")
    parser.add_argument("--requests", type=int, default=1500,
                        help="e2e calls per round for `print` (a quarter of that for `compute`)")
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS),
                        help="e2e sandbox code: print (pure overhead) and/or compute (a typical math call)")
    parser.add_argument("--rounds", type=int, default=3, help="e2e rounds per path (alternating)")
    parser.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray instance")
    parser.add_argument("--split-cpus", action="store_true",
                        help="pin the server to the first half of the CPUs and this script and Ray to the rest "
                             "(the production layout: rollout workers do not share cores with the sandbox)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


# ---- limiter throughput -------------------------------------------------------------------

async def _churn(client: LimiterClient, callers: int, seconds: float) -> int:
    """`callers` loops of acquire -> release for `seconds`; returns grants completed."""
    deadline = time.monotonic() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            permit = await client.acquire()
            client.release(permit)
            done += 1

    await asyncio.gather(*(loop() for _ in range(callers)))
    return done


@ray.remote(num_cpus=0)
class _LoadActor:
    """One more client process for the multi-process scenario."""

    def __init__(self, rate_limit: int):
        self.client = LimiterClient(rate_limit, name=BENCH_LIMITER)

    async def prepare(self) -> None:
        await self.client.connect()
        await _churn(self.client, 4, 0.2)  # warm-up

    async def churn(self, callers: int, seconds: float) -> tuple[int, float]:
        start = time.monotonic()
        grants = await _churn(self.client, callers, seconds)
        elapsed = time.monotonic() - start
        await self.client.close()
        return grants, elapsed


async def bench_limiter(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for label, rate_limit in (("cap not binding", 1_000_000), ("cap binding (rate_limit=32)", 32)):
        client = LimiterClient(rate_limit, name=BENCH_LIMITER)
        await client.connect()
        await _churn(client, 8, 0.3)
        start = time.monotonic()
        grants = await _churn(client, args.limiter_callers, args.limiter_seconds)
        elapsed = time.monotonic() - start
        stats = await client.stats()
        await client.close()
        shutdown_global_limiter(BENCH_LIMITER)  # next scenario starts from a fresh limiter
        results.append({"scenario": f"1 client process, {args.limiter_callers} callers, {label}",
                        "grants": grants, "seconds": elapsed, "grants_per_s": grants / elapsed,
                        "wait_p50_ms": 1000 * stats["wait_s"]["p50"], "wait_p95_ms": 1000 * stats["wait_s"]["p95"]})
        print_row(results[-1])

    actors = [_LoadActor.remote(32) for _ in range(args.limiter_actors)]
    await asyncio.gather(*(a.prepare.remote() for a in actors))
    callers = max(1, args.limiter_callers // args.limiter_actors)
    outcomes = await asyncio.gather(*(a.churn.remote(callers, args.limiter_seconds) for a in actors))
    grants, elapsed = sum(g for g, _ in outcomes), max(e for _, e in outcomes)
    results.append({"scenario": f"{args.limiter_actors} client actors x {callers} callers, cap binding "
                                f"(rate_limit=32)", "grants": grants, "seconds": elapsed,
                    "grants_per_s": grants / elapsed})
    print_row(results[-1])
    for actor in actors:
        ray.kill(actor)
    shutdown_global_limiter(BENCH_LIMITER)
    return results


def print_row(row: dict[str, Any]) -> None:
    extra = ""
    if "wait_p50_ms" in row:
        extra = f"   wait p50 {row['wait_p50_ms']:.2f} ms, p95 {row['wait_p95_ms']:.2f} ms"
    print(f"  {row['scenario']:<70} {row['grants_per_s']:>9,.0f} grants/s{extra}", flush=True)


# ---- end to end -------------------------------------------------------------------------------

# The three ways a call can reach the server, named as the tool's `pool:` values where they
# are one: `direct` (no pool), `ray` (the tool's default under Ray: this process, under a
# cluster-wide permit) and `ray_actor` (through an ExecutionWorker actor).
PATHS = ("direct", "ray", "ray_actor")
# One limiter per pooled path: each keeps up to C idle permits, so with one shared limiter
# the path measured second would first have to win them back from the other.
E2E_LIMITERS = {"ray": "verl-sf-benchmark-e2e", "ray_actor": "verl-sf-benchmark-e2e-actor"}


async def _drive(call, requests: int, concurrency: int) -> float:
    """`requests` calls with `concurrency` in flight; returns calls/s.  Every call must succeed."""
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            response = await call()
            if response.status != RunStatus.Success:
                raise RuntimeError(f"benchmark call failed: {response}")

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.monotonic() - start)


class ProcSnapshot:
    """CPU seconds used so far by every process (reaped children included), from /proc."""

    def __init__(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        self.children: dict[int, list[int]] = {}
        self.cpu: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(entry)
            self.children.setdefault(int(fields[1]), []).append(pid)
            self.cpu[pid] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime

    def tree(self, root: int, exclude: tuple[Optional[int], ...] = ()) -> float:
        total, stack = 0.0, [root]
        while stack:
            pid = stack.pop()
            if pid not in exclude:
                total += self.cpu.get(pid, 0.0)
                stack.extend(self.children.get(pid, []))
        return total


def cpu_by_component(me: int, server_pid: Optional[int], pool_pid: int, limiter_pids: tuple[int, ...]
                     ) -> dict[str, float]:
    """Where a call's CPU goes: this driver, the pool actor, the limiters, the server (if we
    started it) and the rest of Ray (GCS, raylet, idle workers: the driver's other children)."""
    snap = ProcSnapshot()
    parts = {"driver": sum(os.times()[:2]), "pool actor": snap.tree(pool_pid),
             "limiter": sum(snap.tree(pid) for pid in limiter_pids)}
    if server_pid is not None:
        parts["server"] = snap.tree(server_pid)
    parts["ray system"] = sum(snap.tree(child, exclude=(server_pid, pool_pid, *limiter_pids))
                              for child in snap.children.get(me, []))
    return parts


async def bench_e2e(args: argparse.Namespace, url: str, server_pid: Optional[int]) -> list[dict[str, Any]]:
    # The pooled paths send what the tool sends: `run_request` (pickled by reference) and a
    # small BackendConfig; the process that runs it keeps one HttpSandboxBackend per loop.
    spec = HttpBackendConfig(url=url)
    direct_backend = backend_for(spec)
    limiter_pool = RayLimiterDispatcher(args.concurrency, args.concurrency, limiter_name=E2E_LIMITERS["ray"])
    actor = init_execution_pool(args.concurrency, rate_limit=args.concurrency, limiter_name=E2E_LIMITERS["ray_actor"])
    await actor.start.remote()
    await limiter_pool.run(run_request, spec, RunCodeRequest(code="print(1)", language="python"))
    pool_pid = (await actor.stats.remote())["pid"]
    limiter_pids = tuple([(await ray.get_actor(name).stats.remote())["pid"] for name in E2E_LIMITERS.values()])
    me = os.getpid()
    results = []
    for workload in args.workload:
        request = RunCodeRequest(code=WORKLOADS[workload], language="python")
        requests = args.requests if workload == "print" else max(1, args.requests // 4)

        async def direct(request: RunCodeRequest = request) -> RunCodeResponse:
            return await direct_backend.run_code(request)

        async def in_process(request: RunCodeRequest = request) -> RunCodeResponse:
            return (await limiter_pool.run(run_request, spec, request)).response

        async def via_actor(request: RunCodeRequest = request) -> RunCodeResponse:
            return (await actor.execute.remote(run_request, spec, request)).response

        calls = {"direct": direct, "ray": in_process, "ray_actor": via_actor}
        warm = min(requests, 2 * args.concurrency)
        for call in calls.values():
            await _drive(call, warm, args.concurrency)
        rates: dict[str, list[float]] = {name: [] for name in PATHS}
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
        for round_ in range(args.rounds):
            for name in PATHS[round_ % len(PATHS):] + PATHS[:round_ % len(PATHS)]:  # no path always first
                before = cpu_by_component(me, server_pid, pool_pid, limiter_pids)
                rates[name].append(await _drive(calls[name], requests, args.concurrency))
                after = cpu_by_component(me, server_pid, pool_pid, limiter_pids)
                cpu[name].append({k: 1000 * (after[k] - before[k]) / requests for k in after})
                print(f"  {workload:<8} round {round_ + 1}: {name:<9} {rates[name][-1]:8.1f} calls/s", flush=True)
        medians = {name: statistics.median(r) for name, r in rates.items()}
        row = {"workload": workload, "code": WORKLOADS[workload], "concurrency": args.concurrency,
               "requests_per_round": requests, "rounds": args.rounds, "calls_per_s": rates, "median": medians,
               "overhead_pct": {name: statistics.median(
                   100.0 * (1.0 - pooled / direct) for pooled, direct in zip(rates[name], rates["direct"], strict=True))
                                for name in PATHS[1:]},
               "cpu_ms_per_call": {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                                   for name, rows in cpu.items()}}
        results.append(row)
        print(f"  {workload:<8} median calls/s: " + ", ".join(f"{n} {medians[n]:.1f}" for n in PATHS)
              + "; overhead vs direct: " + ", ".join(f"{n} {v:.1f}%" for n, v in row["overhead_pct"].items()),
              flush=True)
        for name, split in row["cpu_ms_per_call"].items():
            cpu = ", ".join(f"{k} {v:.2f}" for k, v in split.items())
            print(f"           cpu ms/call ({name}): {cpu}", flush=True)
    await close_backend(spec)
    await limiter_pool.close()
    await actor.close.remote()
    ray.kill(actor)
    for name in E2E_LIMITERS.values():
        shutdown_global_limiter(name)
    return results


def start_server(extra_args: list[str], cpus: Optional[set[int]]) -> tuple[subprocess.Popen, str]:
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None  # inherited by its sandboxes
    return start_server_process(*extra_args, preexec_fn=pin)


# ---- main -----------------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                          "ray": ray.__version__}, "args": {k: str(v) for k, v in vars(args).items()}}
    server_cpus = None
    if args.split_cpus:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("--split-cpus needs at least 2 CPUs")
        server_cpus, client_cpus = set(cpus[: len(cpus) // 2]), set(cpus[len(cpus) // 2:])
        os.sched_setaffinity(0, client_cpus)  # before ray.init: Ray's processes inherit it
        report["cpu_split"] = {"server": sorted(server_cpus), "client_and_ray": sorted(client_cpus)}
        print(f"server on CPUs {sorted(server_cpus)}, this script and Ray on {sorted(client_cpus)}", flush=True)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, namespace="verl-sf-benchmark",
             log_to_driver=False)
    server = None
    try:
        if args.only in (None, "limiter"):
            print("limiter grant/release throughput (goal >= 5,000/s):", flush=True)
            report["limiter"] = asyncio.run(bench_limiter(args))
        if args.only in (None, "e2e"):
            url = args.url
            if url is None:
                server, url = start_server(args.server_arg, server_cpus)
            print(f"end to end at c={args.concurrency} against {url} (goal: overhead <= 10%):", flush=True)
            report["e2e"] = asyncio.run(bench_e2e(args, url, server.pid if server else None))
    finally:
        if server is not None:
            stop_server(server)
        ray.shutdown()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
