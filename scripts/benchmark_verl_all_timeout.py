#!/usr/bin/env python3
"""verl's `test_integration_concurrency_all_timeout`, run as verl runs it, against a default server.

verl's own `check_correctness` (its thread pool, its client time-out of run_timeout + compile_timeout
+ 10 s, no retry) sends 100 cases of a program that builds a table of ~125 M entries (over 1 GB)
with a 10 s time-out and verl's default 1024 MB memory limit.  Every case must come back with a
verdict: a time-out (-3), a run error such as a memory kill (-2), or a wrong answer (False) where a
case had the CPU to finish; never an API error (-1: a reply that did not arrive in time).  Printed
per round: the count of each verdict, API errors, and the duration.

Example:
  python scripts/benchmark_verl_all_timeout.py --rounds 3
  python scripts/benchmark_verl_all_timeout.py --rounds 3 --checkout /tmp/before   # a baseline checkout
"""

from __future__ import annotations

import argparse
import collections
import json
import threading
import time
from typing import Any, Optional

from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

from verl_sf.server.process import start_server_process, stop_server_process

# verl's test program, as its test writes it.
KNIGHT_MOVES = '''
def knight_moves(X, Y):
    MOD = 10**9 + 7
    dp = [[0] * (Y + 1) for _ in range(X + 1)]
    dp[0][0] = 1
    for i in range(1, X + 1):
        for j in range(1, Y + 1):
            dp[i][j] = (dp[i - 1][j] + dp[i][j - 1]) % MOD
    return dp[X][Y]

def solve():
    X, Y = map(int, input().split())
    print(knight_moves(X, Y))

if __name__ == "__main__":
    solve()
    '''
THREADS = 32  # the semaphore verl's reward manager hands check_correctness


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", type=int, default=100, help="cases per round (verl's test: 100)")
    parser.add_argument("--timeout", type=int, default=10, help="run_timeout per case (verl's test: 10 s)")
    parser.add_argument("--checkout", help="run the server from this checkout's verl_sf (a baseline)")
    parser.add_argument("--url", help="a running server instead of one started here")
    parser.add_argument("--output", help="also write the rounds as JSON here")
    return parser.parse_args(argv)


def one_round(url: str, cases: int, timeout: int) -> dict[str, Any]:
    in_outs = {"inputs": ["324 384429"] * cases, "outputs": [f"output_{i}\n" for i in range(cases)]}
    started = time.monotonic()
    results, metadata = check_correctness(url + "/run_code", in_outs, KNIGHT_MOVES, timeout=timeout,
                                          concurrent_semaphore=threading.Semaphore(THREADS))
    duration = time.monotonic() - started
    api_errors = [m for m in metadata if m.get("api_request_error")]
    statuses = collections.Counter(str(m.get("run_status") or m.get("status") or "?") for m in metadata)
    return {"duration_s": round(duration, 1), "verdicts": dict(collections.Counter(map(str, results))),
            "api_errors": len(api_errors), "run_statuses": dict(statuses),
            "first_api_error": api_errors[0].get("api_request_error") if api_errors else None}


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    process = None
    url = args.url
    if url is None:
        process, url = start_server_process(checkout=args.checkout)
    rounds = []
    try:
        for index in range(args.rounds):
            rounds.append(one_round(url, args.cases, args.timeout))
            print(f"round {index + 1}: {json.dumps(rounds[-1])}", flush=True)
    finally:
        if process is not None:
            stop_server_process(process)
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"checkout": args.checkout or ".", "rounds": rounds}, fh, indent=2)
    return 0 if all(r["api_errors"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
