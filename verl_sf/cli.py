"""`verl-sf`: one entry point, one subcommand per job (serve, rollout)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Optional

from verl_sf import __version__
from verl_sf.cluster import cli as cluster_cli
from verl_sf.errors import VerlSfError
from verl_sf.executor.config import DEFAULT_PRELOAD, ExecutorConfig, IsolationMode


def _add_serve(sub: argparse._SubParsersAction) -> None:
    defaults = ExecutorConfig()
    p = sub.add_parser("serve", help="run the Sandbox Fusion compatible execution server",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed on start)")
    p.add_argument("--workers", type=int, default=defaults.workers, help="sandbox slots: runs executing at once")
    p.add_argument("--max-queue", type=int, default=defaults.max_queue,
                   help="requests that may wait for a slot; more get HTTP 503 with Retry-After")
    p.add_argument("--isolation", choices=[m.value for m in IsolationMode], default=IsolationMode.sandbox.value,
                   help="'none' runs code without any isolation: only for machines without namespaces")
    p.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                   help="run python as `python main.py` per call instead of forking a warm interpreter")
    p.add_argument("--preload", default=",".join(DEFAULT_PRELOAD),
                   help="modules the warm interpreters import up front (missing ones are skipped)")
    p.add_argument("--default-memory-mb", type=int, default=defaults.default_memory_mb,
                   help="memory cap when a request says memory_limit_MB=-1")
    p.add_argument("--output-limit-kb", type=int, default=defaults.output_limit_bytes >> 10,
                   help="stdout and stderr kept per run (each); the rest is cut with a marker")
    p.add_argument("--workdir-size-mb", type=int, default=defaults.workdir_size_mb)
    p.add_argument("--max-processes", type=int, default=defaults.max_processes,
                   help="processes+threads per run")
    p.add_argument("--max-body-mb", type=int, default=64, help="larger request bodies get HTTP 413")
    p.add_argument("--python", default=defaults.python, help="runtime interpreter the code runs with")
    p.add_argument("--fronts", type=int, default=1,
                   help="server processes sharing the port (SO_REUSEPORT), each with a share of --workers")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from verl_sf.executor.sandbox import IsolationUnavailable
    from verl_sf.server import ServerConfig, serve

    executor = ExecutorConfig(
        workers=args.workers, max_queue=args.max_queue, isolation=IsolationMode(args.isolation),
        fast_path=args.fast_path, preload=tuple(m for m in args.preload.split(",") if m),
        default_memory_mb=args.default_memory_mb, output_limit_bytes=args.output_limit_kb << 10,
        workdir_size_mb=args.workdir_size_mb, max_processes=args.max_processes, python=args.python,
    )
    config = ServerConfig(host=args.host, port=args.port, max_body_mb=args.max_body_mb, executor=executor)

    def ready(url: str) -> None:
        print(f"verl-sf {__version__} listening on {url} (isolation: {args.isolation}, workers: {args.workers})",
              flush=True)

    try:
        if args.fronts != 1:
            from verl_sf.server.fronts import run_fronts

            return run_fronts(config, args.fronts, ready, args.log_level)
        asyncio.run(serve(config, ready))
    except IsolationUnavailable as exc:
        print(f"verl-sf: cannot isolate runs: {exc}", file=sys.stderr)
        return 2
    except VerlSfError as exc:  # FrontsError: a bad --fronts, or a front that could not start
        print(f"verl-sf serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_rollout(sub: argparse._SubParsersAction) -> None:
    from verl_sf.rollout.cli import add_arguments, run

    p = sub.add_parser("rollout", help="multi-turn tool rollouts against an OpenAI-compatible model server")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-sf", description=__doc__)
    parser.add_argument("--version", action="version", version=f"verl-sf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_rollout(sub)
    cluster_cli.add_arguments(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
