#!/usr/bin/env python3
"""What a cell costs: `/run_jupyter` with one cell on a server from this checkout and on one from
a baseline checkout (a worktree of the commit before a change), called in turn at concurrency 1 so
both see the same machine at the same moments.  `--mixed` puts a `/run_code` call of the same code
after every cell on each server (a workload of both).

Printed (and written with --output): p50 and p99 per server and API, and the cell's p50 less the
baseline's.

Example:
  git worktree add /tmp/before HEAD~3
  python scripts/benchmark_cells.py --baseline /tmp/before --calls 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Optional

import requests

from verl_sf.server.process import start_server_process, stop_server_process

CODE = "x = sum(i * i for i in range(1000))\nprint(x)\nx"
EXPECTED = f"{sum(i * i for i in range(1000))}\n"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, metavar="DIR", help="checkout whose verl_sf is the baseline")
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per server and API")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured calls per server and API first")
    parser.add_argument("--server-arg", action="append", default=["--preload", ""], metavar="ARG",
                        help="`verl-sf serve` argument for both servers; repeat (default: --preload '')")
    parser.add_argument("--mixed", action="store_true", help="a /run_code call after every cell, on each server")
    parser.add_argument("--output", help="also write the results as JSON here")
    return parser.parse_args(argv)


def call(session: requests.Session, url: str, api: str) -> float:
    body = {"cells": [CODE]} if api == "/run_jupyter" else {"code": CODE, "language": "python"}
    started = time.perf_counter()
    answer = session.post(url + api, json=body, timeout=60).json()
    elapsed = time.perf_counter() - started
    stdout = answer["cells"][0]["stdout"] if api == "/run_jupyter" else answer["run_result"]["stdout"]
    if answer["status"] != "Success" or stdout != EXPECTED:
        raise RuntimeError(f"wrong answer from {api}: {answer}")
    return elapsed


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = {"baseline": os.path.abspath(args.baseline), "this": here}
    servers = {name: start_server_process(*args.server_arg, checkout=path)
               for name, path in checkouts.items()}
    apis = ("/run_jupyter", "/run_code") if args.mixed else ("/run_jupyter",)
    latencies: dict[tuple[str, str], list[float]] = {(n, a): [] for n in servers for a in apis}
    try:
        sessions = {name: requests.Session() for name in servers}
        for index in range(args.warmup + args.calls):
            for (name, api), values in latencies.items():  # in turn: the same moments for both servers
                elapsed = call(sessions[name], servers[name][1], api)
                if index >= args.warmup:
                    values.append(elapsed)
    finally:
        for process, _ in servers.values():
            stop_server_process(process)
    rows = []
    for (name, api), values in latencies.items():
        ordered = sorted(values)
        row = {"server": name, "api": api, "calls": len(values), "p50_ms": 1000 * statistics.median(values),
               "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))]}
        rows.append(row)
        print(f"{name:8s} {api:13s} p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  ({len(values)} calls)")
    p50 = {(row["server"], row["api"]): row["p50_ms"] for row in rows}
    cell_delta = p50["this", "/run_jupyter"] - p50["baseline", "/run_jupyter"]
    control = f" (/run_code: {p50['this', '/run_code'] - p50['baseline', '/run_code']:+.2f} ms)" if args.mixed else ""
    print(f"a cell costs {cell_delta:+.2f} ms at p50 against the baseline{control}")
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"code": CODE, "cpus": os.cpu_count(), "baseline": args.baseline, "server_args": args.server_arg,
                       "mixed": args.mixed,
                       "results": rows, "cell_p50_delta_ms": cell_delta}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
