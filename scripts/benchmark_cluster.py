#!/usr/bin/env python3
"""Benchmark the cluster pieces: front CPU per call, servers pinned to cores, routing overhead.

Three measurements, one load generator (`drive`: N calls of a workload at concurrency C through a
`SandboxBackend`, calls/s over the whole batch), in one run:

  front-cpu  one server: CPU seconds its front process (the asyncio process doing HTTP, JSON and
             pipes) spends per call, read from /proc/PID/stat, and what that caps a 16-, 64- and
             128-core node at with one front, and with one front per core (`serve --fronts`).
  pinned     two servers pinned to one core each (`taskset -c 0` / `-c 1`), calls spread over both,
             against one server pinned to core 0: calls/s for print and numpy at c=64.
  fronts     one server with `--fronts 1` against `--fronts 2` (same slots, all cores), print at c=64.
  routed     the same server reached through the `cluster` backend (`verl-sf cluster up` on a local
             one-node Ray) against direct HTTP, at c=64, interleaved: overhead in %.

    nice -n 10 python scripts/benchmark_cluster.py [--calls 1000] [--only front-cpu pinned routed]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from verl_sf.backends.base import SandboxBackend  # noqa: E402
from verl_sf.backends.http import HttpSandboxBackend  # noqa: E402
from verl_sf.models import RunCodeRequest, RunCodeResponse  # noqa: E402
from verl_sf.server.process import start_server_process, stop_server_process  # noqa: E402

WORKLOADS = {"print": ("print(1)", "1\n"), "numpy": ("import numpy as np\nprint(np.arange(10).sum())", "45\n")}
CORE_COUNTS = (16, 64, 128)
CLK_TCK = os.sysconf("SC_CLK_TCK")


class RoundRobin(SandboxBackend):
    """Direct HTTP to several servers, one after the other: the load generator's 'two servers' target."""

    name = "round-robin"

    def __init__(self, urls: list[str]):
        self._backends = itertools.cycle([HttpSandboxBackend(url) for url in urls])

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        return await next(self._backends).run_code(request)


async def drive(backend: SandboxBackend, workload: str, calls: int, concurrency: int,
                client_cpu: Optional[list[float]] = None) -> float:
    """calls/s for `calls` runs of `workload` at `concurrency`; every answer is checked.  The CPU
    seconds per call of the load generator's event-loop thread (Ray's own threads excluded) are appended
    to `client_cpu`: the routing cost, without the noise of a shared machine's wall clock."""
    code, expected = WORKLOADS[workload]
    request = RunCodeRequest(code=code, language="python")
    slots = asyncio.Semaphore(concurrency)
    wrong: list[str] = []

    async def one() -> None:
        async with slots:
            response = await backend.run_code(request)
            if response.run_result is None or response.run_result.stdout != expected:
                wrong.append(response.model_dump_json()[:200])

    await asyncio.gather(*(one() for _ in range(min(concurrency, calls))))  # warm connections and interpreters
    started, cpu_started = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(one() for _ in range(calls)))
    elapsed = time.perf_counter() - started
    if client_cpu is not None:
        client_cpu.append((time.thread_time() - cpu_started) / calls)
    if wrong:
        raise RuntimeError(f"{len(wrong)} wrong answers, e.g. {wrong[0]}")
    return calls / elapsed


def pinned_to(core: int) -> Callable[[], None]:
    """preexec_fn: the server and every sandbox it starts run on `core` only (as `taskset -c core`)."""
    return lambda: os.sched_setaffinity(0, {core})


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own utime+stime, utime+stime+cutime+cstime) of one process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / CLK_TCK, (utime + stime + cutime + cstime) / CLK_TCK


def tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def sandbox_cpu(server_pid: int) -> float:
    """CPU of everything below the server (zygotes and the runs they reaped)."""
    total = 0.0
    for pid in tree(server_pid)[1:]:
        try:
            total += cpu_seconds(pid)[1]
        except OSError:
            continue
    return total


async def front_cpu(calls: int, workers: int) -> dict[str, float]:
    proc, url = start_server_process("--slots", str(workers))
    try:
        backend = HttpSandboxBackend(url)
        await drive(backend, "print", workers * 4, workers)
        front0, sandbox0 = cpu_seconds(proc.pid)[0], sandbox_cpu(proc.pid)
        rate = await drive(backend, "print", calls, workers * 2)
        front = (cpu_seconds(proc.pid)[0] - front0) / calls
        sandbox = (sandbox_cpu(proc.pid) - sandbox0) / calls
        await backend.close()
    finally:
        stop_server_process(proc)
    return {"front_cpu_ms": front * 1e3, "sandbox_cpu_ms": sandbox * 1e3, "calls_per_s": rate}


def print_front_cpu(result: dict[str, float]) -> None:
    front, sandbox = result["front_cpu_ms"] / 1e3, result["sandbox_cpu_ms"] / 1e3
    print(f"front CPU per print(1) call: {front * 1e3:.3f} ms; sandbox CPU per call: {sandbox * 1e3:.3f} ms "
          f"(measured at {result['calls_per_s']:.0f} calls/s)")
    print(f"{'cores':>6}  {'one front: calls/s cap':>24}  {'one front per core: calls/s cap':>32}")
    for cores in CORE_COUNTS:
        one_front = min(1 / front, cores / (front + sandbox))
        per_core = cores / (front + sandbox)
        print(f"{cores:>6}  {one_front:>24,.0f}  {per_core:>32,.0f}")


async def pinned(calls: int, concurrency: int, workers: int) -> dict[str, dict[str, float]]:
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("pinned: needs two cores")
    one, one_url = start_server_process("--slots", str(workers), preexec_fn=pinned_to(0))
    two, two_url = start_server_process("--slots", str(workers), preexec_fn=pinned_to(1))
    results: dict[str, dict[str, float]] = {}
    try:
        for workload in WORKLOADS:
            single = RoundRobin([one_url])
            double = RoundRobin([one_url, two_url])
            results[workload] = {"one": await drive(single, workload, calls, concurrency),
                                 "two": await drive(double, workload, calls, concurrency)}
    finally:
        stop_server_process(one)
        stop_server_process(two)
    return results


async def fronts(calls: int, concurrency: int, workers: int) -> dict[int, float]:
    """calls/s of one server with 1 and with 2 front processes (the same total slots)."""
    results = {}
    for count in (1, 2):
        proc, url = start_server_process("--slots", str(workers), "--fronts", str(count))
        try:
            results[count] = await drive(RoundRobin([url]), "print", calls, concurrency)
        finally:
            stop_server_process(proc)
    return results


async def routed(calls: int, concurrency: int, workers: int, rounds: int) -> dict[str, list[float]]:
    """calls/s and the load generator's CPU per call, direct HTTP and through the cluster backend."""
    import ray

    from verl_sf.backends.cluster import ClusterSandboxBackend
    from verl_sf.cluster import fleet

    namespace = "verl-sf-benchmark"
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=1, include_dashboard=False, namespace=namespace, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024)
    try:
        rows = fleet.up(namespace, None, ["--slots", str(workers)])
        direct = HttpSandboxBackend(rows[0].url or "")
        cluster = ClusterSandboxBackend(namespace=namespace)
        results: dict[str, list[float]] = {"direct": [], "cluster": [], "direct_cpu": [], "cluster_cpu": []}
        for _ in range(rounds):
            results["direct"].append(await drive(direct, "print", calls, concurrency, results["direct_cpu"]))
            results["cluster"].append(await drive(cluster, "print", calls, concurrency, results["cluster_cpu"]))
        await cluster.close()
        return results
    finally:
        fleet.down(namespace)
        ray.shutdown()


async def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per measurement")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--slots", type=int, default=4, help="CPU slots per server")
    parser.add_argument("--rounds", type=int, default=3, help="routed: direct/cluster pairs, interleaved")
    parser.add_argument("--only", nargs="+", choices=["front-cpu", "pinned", "fronts", "routed"],
                        default=["front-cpu", "pinned", "fronts", "routed"])
    args = parser.parse_args(argv)
    print(f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; calls={args.calls} "
          f"c={args.concurrency} slots/server={args.slots}", flush=True)
    if "front-cpu" in args.only:
        print_front_cpu(await front_cpu(args.calls, args.slots))
    if "pinned" in args.only:
        for workload, rates in (await pinned(args.calls, args.concurrency, args.slots)).items():
            print(f"pinned {workload}: one server on 1 core {rates['one']:.0f} calls/s; two servers on 1 core "
                  f"each {rates['two']:.0f} calls/s ({rates['two'] / rates['one']:.2f}x)", flush=True)
    if "fronts" in args.only:
        by_fronts = await fronts(args.calls, args.concurrency, args.slots)
        print(f"fronts print c={args.concurrency}: --fronts 1 {by_fronts[1]:.0f} calls/s, --fronts 2 "
              f"{by_fronts[2]:.0f} calls/s ({by_fronts[2] / by_fronts[1]:.2f}x)", flush=True)
    if "routed" in args.only:
        routed_rates = await routed(args.calls, args.concurrency, args.slots, args.rounds)
        direct, cluster = statistics.median(routed_rates["direct"]), statistics.median(routed_rates["cluster"])
        print(f"routed print c={args.concurrency}: direct HTTP {direct:.0f} calls/s, cluster backend "
              f"{cluster:.0f} calls/s (median of {args.rounds}; overhead {100 * (1 - cluster / direct):+.1f}%) "
              f"direct={[round(r) for r in routed_rates['direct']]} "
              f"cluster={[round(r) for r in routed_rates['cluster']]}")
        direct_cpu = statistics.median(routed_rates["direct_cpu"]) * 1e3
        cluster_cpu = statistics.median(routed_rates["cluster_cpu"]) * 1e3
        print(f"routed client CPU per call: direct HTTP {direct_cpu:.3f} ms, cluster backend {cluster_cpu:.3f} ms "
              f"(+{cluster_cpu - direct_cpu:.3f} ms)")


if __name__ == "__main__":
    asyncio.run(main())
