#!/usr/bin/env python3
"""Per-language micro-benchmark: hello world through `POST /run_code`, compile and run stages apart.

For each language: the p50 latency of one call at a time (c=1) with the p50 of its compile and run
stages (the sandbox's own `execution_time`), then calls/s with `--concurrency` (16) in flight.
Starts its own `verl-sf serve` unless given `--url`.  Results go to stdout as a Markdown table and,
with `--json`, to a file.  Short by default: it is a comparison between languages, not a soak.

    nice -n 10 python scripts/benchmark_languages.py --languages python,cpp,java --calls 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_languages import DOUBLE
from verl_sf.server.process import start_server_process, stop_server_process


def call(url: str, language: str) -> dict:
    started = time.perf_counter()
    body = requests.post(url + "/run_code", json={"code": DOUBLE[language], "language": language, "stdin": "21\n",
                                                  "compile_timeout": 300, "run_timeout": 120}, timeout=600).json()
    if body["status"] != "Success":
        raise RuntimeError(f"{language}: {body['status']}: {body.get('message')}")
    compile_result = body.get("compile_result") or {}
    return {"latency": time.perf_counter() - started, "compile": compile_result.get("execution_time"),
            "run": body["run_result"]["execution_time"]}


def p50_ms(values: list[float | None]) -> float | None:
    """Median in milliseconds of the values present (a language without a compile stage has none)."""
    present = [v for v in values if v is not None]
    return 1000 * statistics.median(present) if present else None


def measure(url: str, language: str, calls: int, concurrency: int) -> dict:
    call(url, language)  # warm-up: page cache, JIT caches
    serial = [call(url, language) for _ in range(calls)]
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: call(url, language), range(calls * 2)))
    return {"language": language, "p50_ms": p50_ms([r["latency"] for r in serial]),
            "compile_p50_ms": p50_ms([r["compile"] for r in serial]), "run_p50_ms": p50_ms([r["run"] for r in serial]),
            "calls_per_s": calls * 2 / (time.perf_counter() - started)}


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an already running server (default: start one)")
    parser.add_argument("--languages", help="comma-separated (default: every language the server has)")
    parser.add_argument("--calls", type=int, default=8, help="serial calls per language (twice as many at c=16)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4, help="sandbox slots of the server this script starts")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server_process("--workers", str(args.workers))
    try:
        available = set(requests.get(url + "/health", timeout=30).json()["languages"])
        wanted = args.languages.split(",") if args.languages else sorted(available & set(DOUBLE), key=str.lower)
        rows = []
        print(f"| language | p50 c=1 (ms) | compile p50 (ms) | run p50 (ms) | calls/s c={args.concurrency} |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for language in wanted:
            row = measure(url, language, args.calls, args.concurrency)
            rows.append(row)
            print(f"| {language} | {fmt(row['p50_ms'])} | {fmt(row['compile_p50_ms'])} | {fmt(row['run_p50_ms'])} "
                  f"| {row['calls_per_s']:.1f} |", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    finally:
        if proc is not None:
            stop_server_process(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
