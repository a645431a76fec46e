#!/usr/bin/env python3
"""How far the stateless path is from its floor, same run, on each isolation rung this host has.

At concurrency 1, wall-clock p50 and p99 of:
  - fork + exit + waitpid of a warm interpreter (the stdlib list, heap frozen, as a zygote holds it);
  - the same with fresh PID, mount and IPC namespaces, /proc mounted, and a pooled network
    namespace joined (setns), as a run's child makes them (as root only);
  - an empty `/run_code` (`pass`) through a real `verl-sf serve` on each rung;
  - `GET /v1/ping` on the same server (HTTP and the event loop, no sandbox).
The difference between the empty run and ping plus the fork with namespaces is what the executor,
the zygote protocol and a run's set-up and teardown add (docs/performance.md, "The floor, and why").

Example:
  python scripts/benchmark_floor.py --calls 1000 --output docs/benchmarks/floor.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x4000, 0x40000, 2, 4, 8


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": ordered[int(len(ordered) * 0.99) - 1] * 1000,
            "calls": len(ordered)}


def fork_floor(calls: int, modules: list[str]) -> dict[str, dict[str, float]]:
    """In this (clean, -I) interpreter holding `modules`: the two fork variants' wall time per iteration."""
    for name in modules:
        __import__(name)
    gc.collect()
    gc.freeze()
    found = {"fork + exit": summary(_forks(calls, None))}
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(CLONE_NEWNS)  # our own mount namespace: the children's /proc mounts stay in it
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        found["fork + exit, with namespaces"] = summary(_forks(calls, libc))
    return found


def _forks(calls: int, libc: Optional[ctypes.CDLL]) -> list[float]:
    network = -1
    if libc is not None:  # one network namespace made ahead, joined by every child (as the zygote pools them)
        maker = os.fork()
        if maker == 0:
            libc.unshare(CLONE_NEWNET)
            time.sleep(3600)
            os._exit(0)
        time.sleep(0.2)
        network = os.open(f"/proc/{maker}/ns/net", os.O_RDONLY)
        own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    times = []
    try:
        for index in range(calls + calls // 10):
            started = time.perf_counter()
            if libc is not None:
                libc.setns(own_pidns, CLONE_NEWPID)
                libc.unshare(CLONE_NEWPID)
            pid = os.fork()
            if pid == 0:
                if libc is not None:
                    libc.unshare(CLONE_NEWNS | CLONE_NEWIPC)
                    libc.setns(network, CLONE_NEWNET)
                    libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
                os._exit(0)
            os.waitpid(pid, 0)
            if index >= calls // 10:  # the first tenth warms up
                times.append(time.perf_counter() - started)
    finally:
        if network >= 0:
            os.close(network)
            os.kill(maker, 9)
            os.waitpid(maker, 0)
    return times


def served(rung: str, calls: int) -> dict[str, dict[str, float]]:
    """An empty run and a ping, in turn, on a server of `rung`."""
    import requests

    from verl_sf.server.process import start_server_process, stop_server_process

    process, url = start_server_process("--isolation", rung, "--preload", "", "--slots", "2")
    try:
        session = requests.Session()
        runs, pings = [], []
        for index in range(calls + calls // 10):
            started = time.perf_counter()
            answer = session.post(url + "/run_code", json={"code": "pass", "language": "python"}, timeout=60).json()
            ran = time.perf_counter() - started
            if answer["status"] != "Success":
                raise RuntimeError(f"the empty run failed: {answer}")
            started = time.perf_counter()
            session.get(url + "/v1/ping", timeout=60).raise_for_status()
            pinged = time.perf_counter() - started
            if index >= calls // 10:
                runs.append(ran)
                pings.append(pinged)
    finally:
        stop_server_process(process)
    return {f"empty /run_code ({rung})": summary(runs), f"GET /v1/ping ({rung})": summary(pings)}


def available_rungs() -> list[str]:
    from verl_sf.executor.rungs import RUNGS, probe_all

    return [report.rung for report in probe_all() if report.available and RUNGS[report.rung].confined]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="measured iterations of each figure")
    parser.add_argument("--rung", action="append", choices=["namespaces", "landlock"],
                        help="a rung to measure the server on (repeat; default: every rung this host has)")
    parser.add_argument("--forks-only", metavar="MODULES", help=argparse.SUPPRESS)  # the clean child's part
    parser.add_argument("--output", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.forks_only is not None:
        print(json.dumps(fork_floor(args.calls, args.forks_only.split(","))))
        return 0
    from verl_sf.executor.config import STDLIB_PRELOAD

    # The fork floor in a clean interpreter (-I, as the zygote runs), not in one holding this package.
    command = [sys.executable, "-I", os.path.abspath(__file__), "--forks-only", ",".join(STDLIB_PRELOAD),
               "--calls", str(args.calls)]
    forks = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    results: dict[str, dict[str, float]] = json.loads(forks)
    for rung in args.rung or available_rungs():
        results.update(served(rung, args.calls))
    for label, figures in results.items():
        print(f"{label:<40} p50 {figures['p50_ms']:7.3f} ms  p99 {figures['p99_ms']:7.3f} ms  ({figures['calls']:.0f})")
    if args.output:
        with open(args.output, "w") as out:
            json.dump({"calls": args.calls, "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
