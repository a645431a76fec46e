#!/usr/bin/env python3
"""Benchmark code-execution backends for RL tool calls (compatible with the Daytona
verl-retool guide's benchmark_tool_backends.py: same flags, scenarios and CSV columns).

Load model (the guide's): at concurrency C, each iteration is one batch of C calls started
together, and the next batch starts when the whole batch has answered.  --warmup batches run
first, unmeasured; then --iterations measured batches, i.e. C x iterations measured calls per
level (iterations = calls per virtual client).  Throughput = measured calls / summed batch
wall time.  Every run is bounded: fixed call counts, and a deadline per call.

Examples:
  # naive baseline vs verl-sf (server started and stopped by the script), all scenarios
  python scripts/benchmark_tool_backends.py --backend subprocess verl-sf
  # a running server, or the official Sandbox Fusion image
  python scripts/benchmark_tool_backends.py --backend sandbox_fusion --url http://127.0.0.1:8080
  # the same server from another checkout (a baseline: a worktree of an earlier commit), same run
  python scripts/benchmark_tool_backends.py --backend verl-sf --checkout /tmp/prev
  # verl-sf with the fast path off (any `verl-sf serve` flag passes through)
  python scripts/benchmark_tool_backends.py --backend verl-sf --server-arg=--no-fast-path
  # bursts of slow code (loops beside short runs, sleeps, the medium case) against the naive baseline
  python scripts/benchmark_tool_backends.py --backend subprocess verl-sf --scenarios --bursts loops sleeps medium
  # fork bombs beside short runs (verl-sf only: the baseline bounds no processes)
  python scripts/benchmark_tool_backends.py --backend verl-sf --scenarios --bursts bombs
  # one chart over earlier runs
  python scripts/benchmark_tool_backends.py --compare outputs/subprocess/2025... outputs/verl-sf/2025...

  # sessions: print in a live session vs stateless, the /v1/ping floor, an idle session's memory
  python scripts/benchmark_tool_backends.py --scenarios simple_stdout session_print http_ping --concurrency 1 64

Scenarios a backend cannot run (sessions, /v1/ping) are skipped for it and listed in summary.json.
Outputs: <output-root>/<backend>/<UTC time>/{summary.json,results.csv,throughput.png}
(+ bursts.csv with --bursts, server.log for a server the script started); with several backends,
or --compare, also <output-root>/compare/<UTC time>/{comparison.csv,throughput.png} (+ comparison_bursts.csv).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from tqdm import tqdm

from bench import bursts
from bench.backends import ALIASES, BACKENDS, BackendSkipped, BenchBackend, make_backend
from bench.memory import tree_memory_mb
from bench.report import (
    BURST_COLUMNS,
    CSV_COLUMNS,
    BadOutputDir,
    compare,
    load_run,
    plot_throughput,
    write_csv,
    write_json,
)
from bench.runner import Settings, measure_level
from bench.scenarios import SCENARIOS, Kind
from bench.session_memory import idle_session_memory

DEFAULT_CONCURRENCY = [1, 4, 8, 16, 32, 64, 128]
DEFAULT_WARMUP, DEFAULT_ITERATIONS = 3, 20
QUICK_CONCURRENCY, QUICK_WARMUP, QUICK_ITERATIONS = [1, 8, 32], 1, 3
EXIT_ALL_SKIPPED = 3


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", nargs="+", default=["verl-sf"], metavar="NAME",
                        help=f"one or several of: {', '.join(BACKENDS)} (default: verl-sf)")
    parser.add_argument("--url", help="verl-sf: a running server (else the script starts one); "
                                      "sandbox_fusion: the server, e.g. http://127.0.0.1:8080 (/run_code optional)")
    parser.add_argument("--sandbox-fusion-url", help="sandbox_fusion's address when --url names a verl-sf server")
    parser.add_argument("--checkout", metavar="DIR",
                        help="verl-sf: start the server from this checkout's verl_sf (a baseline, e.g. a worktree "
                             "of an earlier commit) rather than the installed one; its commit labels the results")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra `verl-sf serve` argument for the server the script starts; repeat, "
                             "e.g. --server-arg=--no-fast-path")
    parser.add_argument("--concurrency", nargs="+", type=int, metavar="C",
                        help=f"concurrent calls per batch (default: {' '.join(map(str, DEFAULT_CONCURRENCY))})")
    parser.add_argument("--warmup", "--warmups", type=int, dest="warmup",
                        help=f"unmeasured batches before each level (default: {DEFAULT_WARMUP})")
    parser.add_argument("--iterations", type=int,
                        help=f"measured batches of C simultaneous calls per level = calls per virtual client "
                             f"(default: {DEFAULT_ITERATIONS})")
    parser.add_argument("--pause-ms", type=float, default=0.0,
                        help="a pause after each batch, not measured: a rollout's generation between its tool "
                             "calls (default: 0, as the guide)")
    parser.add_argument("--scenarios", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS),
                        help="default: all; `--scenarios` alone: none (e.g. bursts only)")
    parser.add_argument("--bursts", nargs="*", choices=list(bursts.BURSTS), default=[],
                        help="bursts of slow code, each sent once with verl's client deadline (see bench/bursts.py); "
                             "default: none")
    parser.add_argument("--burst-scale", type=float, default=1.0,
                        help="multiplies every burst's size (1: 100 loops, 64 sleeps, 256 medium programs, "
                             "16 bombs and 40 short runs)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: concurrency {' '.join(map(str, QUICK_CONCURRENCY))}, warmup {QUICK_WARMUP}, "
                             f"iterations {QUICK_ITERATIONS} (explicit flags still win)")
    parser.add_argument("--run-timeout", "--default-timeout", type=float, default=30.0, dest="run_timeout",
                        help="run_timeout sent with every call, seconds (default: 30, as the guide)")
    parser.add_argument("--client-timeout", type=float,
                        help="the benchmark's own deadline per call incl. any queueing; a miss counts in "
                             "client_timeout_count (default: max(120, 4 x run-timeout))")
    parser.add_argument("--memory-limit-mb", type=int, default=-1, help="memory_limit_MB per call (default: -1, "
                                                                         "the server's default)")
    parser.add_argument("--memory-interval", type=float, default=2.0,
                        help="seconds between memory samples (Pss) of the backend's process tree during a "
                             "level; each sample costs the load generator tens of ms of CPU; 0: off")
    parser.add_argument("--session-memory", type=int, default=8, metavar="N",
                        help="open N idle sessions after the levels and report their memory (Pss) when a "
                             "session scenario ran; 0: off (default: 8)")
    parser.add_argument("--output-root", type=Path, default=Path("outputs"))
    parser.add_argument("--compare", nargs="+", type=Path, metavar="DIR",
                        help="do not run: plot and tabulate earlier output directories together")
    parser.add_argument("--baseline", default="subprocess", help="backend the comparison's ratios are against")
    parser.add_argument("--docker-image", default="python:3.11-slim")
    parser.add_argument("--docker-memory", default="256m")
    args = parser.parse_args(argv)

    args.backend = list(dict.fromkeys(ALIASES.get(name, name) for name in args.backend))
    unknown = [name for name in args.backend if name not in BACKENDS]
    if unknown:
        parser.error(f"--backend: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(BACKENDS)}")
    args.concurrency = args.concurrency or (QUICK_CONCURRENCY if args.quick else DEFAULT_CONCURRENCY)
    args.warmup = (QUICK_WARMUP if args.quick else DEFAULT_WARMUP) if args.warmup is None else args.warmup
    if args.iterations is None:
        args.iterations = QUICK_ITERATIONS if args.quick else DEFAULT_ITERATIONS
    if any(c < 1 for c in args.concurrency):
        parser.error(f"--concurrency: every level must be >= 1, got {args.concurrency}")
    if not args.scenarios and not args.bursts:
        parser.error("nothing to run: give --scenarios, --bursts, or both")
    if args.burst_scale <= 0:
        parser.error(f"--burst-scale must be > 0, got {args.burst_scale}")
    if args.iterations < 1 or args.warmup < 0:
        parser.error(f"--iterations must be >= 1 and --warmup >= 0, got {args.iterations} and {args.warmup}")
    if args.pause_ms < 0:
        parser.error(f"--pause-ms must be >= 0, got {args.pause_ms}")
    if args.run_timeout <= 0:
        parser.error(f"--run-timeout must be > 0, got {args.run_timeout}")
    if args.client_timeout is None:
        args.client_timeout = max(120.0, 4 * args.run_timeout)
    if args.client_timeout <= 0:
        parser.error(f"--client-timeout must be > 0, got {args.client_timeout}")
    if args.server_arg and "verl-sf" not in args.backend:
        parser.error("--server-arg only applies to --backend verl-sf")
    if args.checkout and ("verl-sf" not in args.backend or args.url):
        parser.error("--checkout needs --backend verl-sf and a server the script starts (no --url)")
    if args.checkout and not Path(args.checkout, "verl_sf").is_dir():
        parser.error(f"--checkout {args.checkout}: no verl_sf package there")
    if args.server_arg and args.url and "sandbox_fusion" not in args.backend:
        parser.error("--server-arg needs a server the script starts; drop --url")
    if "sandbox_fusion" in args.backend and not (args.url or args.sandbox_fusion_url):
        parser.error("--backend sandbox_fusion needs the server's address: --url or --sandbox-fusion-url")
    if "sandbox_fusion" in args.backend and "verl-sf" in args.backend and args.url and not args.sandbox_fusion_url:
        parser.error("--url is ambiguous with both verl-sf and sandbox_fusion; give sandbox_fusion's address "
                     "as --sandbox-fusion-url")
    return args


def backend_url(args: argparse.Namespace, name: str) -> Optional[str]:
    if name == "sandbox_fusion":
        return args.sandbox_fusion_url or args.url
    return args.url if name == "verl-sf" else None


def commit_of(checkout: str) -> str:
    """The checkout's short commit (its directory's name where git cannot say)."""
    try:
        found = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return Path(checkout).name
    return found.stdout.strip() or Path(checkout).name


def new_output_dir(root: Path, name: str, stamp: str) -> Path:
    directory = root / name / stamp
    suffix = 1
    while directory.exists():  # two runs in one second: keep both
        directory = root / name / f"{stamp}-{suffix}"
        suffix += 1
    directory.mkdir(parents=True)
    return directory


def remove_if_empty(directory: Path) -> None:
    """A backend that was skipped or failed before measuring leaves no empty directories
    behind (a failed server start keeps its server.log)."""
    for path in (directory, directory.parent):
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def terminal_table(label: str, rows: list[dict]) -> str:
    header = (f"{'scenario':>16} {'conc':>5} {'p50 (s)':>8} {'p95 (s)':>8} {'calls/s':>9} {'ok':>6} {'fail':>5} "
              f"{'t/o':>4}")
    lines = [f"\n{label}", header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['scenario']:>16} {r['concurrency']:>5} {r['p50_s']:>8.4f} {r['p95_s']:>8.4f} "
                     f"{r['throughput_calls_per_s']:>9.1f} {r['success_count']:>6} {r['failure_count']:>5} "
                     f"{r['timeout_count'] + r['client_timeout_count']:>4}")
    return "\n".join(lines)


def session_comparison(rows: list[dict]) -> list[dict]:
    """Per concurrency: session_print's throughput over simple_stdout's, and its p50 over http_ping's."""
    by = {(r["scenario"], r["concurrency"]): r for r in rows}
    out = []
    for (scenario, concurrency), row in sorted(by.items(), key=lambda item: item[0][1]):
        if scenario != "session_print":
            continue
        stateless, ping = by.get(("simple_stdout", concurrency)), by.get(("http_ping", concurrency))
        out.append({
            "concurrency": concurrency,
            "session_calls_per_s": row["throughput_calls_per_s"],
            "stateless_calls_per_s": stateless["throughput_calls_per_s"] if stateless else None,
            "throughput_ratio": row["throughput_calls_per_s"] / stateless["throughput_calls_per_s"]
            if stateless and stateless["throughput_calls_per_s"] else None,
            "session_p50_s": row["p50_s"],
            "ping_p50_s": ping["p50_s"] if ping else None,
            "p50_over_ping_ms": 1000 * (row["p50_s"] - ping["p50_s"]) if ping else None,
        })
    return out


def sessions_table(sessions: dict) -> str:
    lines = ["\nsessions (session_print vs simple_stdout and http_ping, same run)",
             f"{'conc':>5} {'session/s':>10} {'stateless/s':>12} {'ratio':>6} {'p50 (ms)':>9} {'ping p50':>9} "
             f"{'+ms':>6}"]

    def fmt(value: Optional[float], spec: str) -> str:
        return format(value, spec) if value is not None else "-"

    for r in sessions["vs_stateless"]:
        lines.append(f"{r['concurrency']:>5} {fmt(r['session_calls_per_s'], '>10.1f')} "
                     f"{fmt(r['stateless_calls_per_s'], '>12.1f')} {fmt(r['throughput_ratio'], '>6.2f')} "
                     f"{1000 * r['session_p50_s']:>9.3f} "
                     f"{fmt(r['ping_p50_s'] and 1000 * r['ping_p50_s'], '>9.3f')} "
                     f"{fmt(r['p50_over_ping_ms'], '>6.3f')}")
    memory = sessions["idle_memory"]
    lines.append(f"idle stdlib session: Pss median {fmt(memory['pss_mib_median'], '.2f')} MiB, "
                 f"max {fmt(memory['pss_mib_max'], '.2f')} MiB over {memory['measured']}/{memory['sessions']} "
                 f"sessions (server's memory_bytes median {fmt(memory['server_memory_bytes_mib_median'], '.2f')} MiB)")
    return "\n".join(lines)


async def run_backend(args: argparse.Namespace, name: str, stamp: str) -> Optional[Path]:
    """Benchmark one backend; returns its output directory, or None when it was skipped."""
    out_dir = new_output_dir(args.output_root, name, stamp)
    connections = max(max(args.concurrency), bursts.connections_needed(args.bursts, args.burst_scale))
    checkout = args.checkout if name == "verl-sf" else None
    backend: BenchBackend = make_backend(name, url=backend_url(args, name), server_args=args.server_arg,
                                         checkout=checkout, log_dir=out_dir, max_concurrency=connections,
                                         client_timeout=args.client_timeout, docker_image=args.docker_image,
                                         docker_memory=args.docker_memory)
    settings = Settings(args.warmup, args.iterations, args.run_timeout, args.client_timeout,
                        args.memory_limit_mb, args.memory_interval, args.pause_ms / 1000)
    label = " ".join([name, *args.server_arg, *([commit_of(checkout)] if checkout else [])])
    summary: dict[str, Any] = {
        "backend": name, "label": label, "created_at": datetime.now(timezone.utc).isoformat(),
        "host": platform.platform(), "python_version": platform.python_version(), "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "load_model": "iterations = measured batches of `concurrency` simultaneous calls per level",
        "config": {"concurrency": args.concurrency, "warmup": args.warmup, "iterations": args.iterations,
                   "pause_ms": args.pause_ms,
                   "scenarios": args.scenarios, "bursts": args.bursts, "burst_scale": args.burst_scale,
                   "run_timeout": args.run_timeout,
                   "client_timeout": args.client_timeout, "memory_limit_MB": args.memory_limit_mb,
                   "url": backend_url(args, name), "server_args": args.server_arg, "checkout": checkout},
        "memory": {"measure": "Pss summed over the process tree, MiB"},
        "results": [],
        "bursts": [],
    }
    try:
        try:
            await backend.start(connections)
        except BackendSkipped as exc:
            print(f"SKIPPED {exc}", file=sys.stderr)
            return None
        summary["server"] = await backend.describe()
        root = backend.memory_root_pid
        summary["memory"]["root_pid"] = root
        summary["memory"]["root_pid_is_benchmark_process"] = root == os.getpid()
        summary["memory"]["idle_after_start_mb"] = tree_memory_mb(root) if root else None
        runnable = [name for name in args.scenarios if await backend.supports(SCENARIOS[name].kind)]
        summary["skipped_scenarios"] = [name for name in args.scenarios if name not in runnable]
        if summary["skipped_scenarios"]:
            print(f"{label}: skipping {', '.join(summary['skipped_scenarios'])} (not supported here)", file=sys.stderr)
        total = sum((args.warmup + args.iterations) * c for c in args.concurrency) * len(runnable)
        with tqdm(total=total, desc=label, unit="call", dynamic_ncols=True, disable=not total) as bar:
            for scenario_name in runnable:
                for concurrency in args.concurrency:
                    bar.set_postfix_str(f"{scenario_name} c={concurrency}")
                    row = await measure_level(backend, SCENARIOS[scenario_name], concurrency, settings,
                                              lambda: bar.update(1))
                    summary["results"].append(row)
                    bar.write(f"{label} {scenario_name} c={concurrency}: p50={row['p50_s']:.4f}s "
                              f"{row['throughput_calls_per_s']:.1f} calls/s "
                              f"{row['success_count']}/{row['measured_call_count']} ok")
                    # Written after every level, so an interrupted run keeps what it measured.
                    write_json(out_dir / "summary.json", summary)
                    write_csv(out_dir / "results.csv", summary["results"], CSV_COLUMNS)
            for burst_name in args.bursts:
                if burst_name in bursts.NEEDS_BOUNDS and not backend.bounds_processes:
                    bar.write(f"{label} burst {burst_name}: not run (this backend does not bound a run's processes)")
                    continue
                bar.set_postfix_str(f"burst {burst_name}")
                row = await bursts.BURSTS[burst_name](backend, args.burst_scale)
                summary["bursts"].append(row)
                bar.write(f"{label} burst {burst_name}: {row['answered_in_time']}/{row['calls']} answered in time, "
                          f"{row['expected_verdicts']} as expected, slowest {row['slowest_reply_s']:.1f}s")
                write_json(out_dir / "summary.json", summary)
                write_csv(out_dir / "bursts.csv", summary["bursts"], BURST_COLUMNS)
        summary["memory"]["idle_after_run_mb"] = tree_memory_mb(root) if root else None
        if args.session_memory and any(SCENARIOS[name].kind == Kind.session for name in runnable):
            summary["sessions"] = {"idle_memory": await idle_session_memory(backend, args.session_memory),
                                   "vs_stateless": session_comparison(summary["results"])}
            write_json(out_dir / "summary.json", summary)
    finally:
        # Files first (no awaits): a second interrupt during close() must not cost the plot.
        if summary["results"] or summary["bursts"]:
            write_json(out_dir / "summary.json", summary)
        if summary["results"]:
            plot_throughput([(label, summary["results"])], out_dir / "throughput.png", f"{label} throughput")
        await backend.close()
        if not summary["results"] and not summary["bursts"]:
            remove_if_empty(out_dir)
    if summary["results"]:
        print(terminal_table(label, summary["results"]))
    if summary["bursts"]:
        print(bursts.terminal_table(label, summary["bursts"]))
    if "sessions" in summary:
        print(sessions_table(summary["sessions"]))
    if not summary["results"] and not summary["bursts"]:
        return None  # nothing it could run: nothing saved, nothing to compare
    print(f"saved {out_dir}")
    return out_dir


async def run_all(args: argparse.Namespace) -> int:
    # SIGTERM (e.g. from `timeout`) cancels the run like Ctrl-C does, so the `finally`
    # blocks stop a server the script started instead of orphaning it.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    ran: list[Path] = []
    failed: list[str] = []
    for name in args.backend:
        try:
            out_dir = await run_backend(args, name, stamp)
        except (RuntimeError, ValueError) as exc:  # a backend that cannot start must not cost the others
            print(f"FAILED {name}: {exc}", file=sys.stderr)
            failed.append(name)
            continue
        if out_dir is not None:
            ran.append(out_dir)
    if len(ran) > 1:
        out = new_output_dir(args.output_root, "compare", stamp)
        compare([load_run(d) for d in ran], out, args.baseline)
        print(f"comparison saved {out}")
    if failed:
        return 1
    return 0 if ran else EXIT_ALL_SKIPPED


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.compare:
        try:
            summaries = [load_run(d) for d in args.compare]
        except BadOutputDir as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        out = new_output_dir(args.output_root, "compare", datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
        compare(summaries, out, args.baseline)
        print(f"comparison saved {out}")
        return 0
    try:
        return asyncio.run(run_all(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; levels measured so far are saved", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    raise SystemExit(main())
