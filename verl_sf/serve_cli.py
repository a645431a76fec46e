"""`verl-sf serve`: the Sandbox Fusion compatible execution server, from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_sf import __version__
from verl_sf.daytona import DaytonaConfig
from verl_sf.e2b import E2BConfig
from verl_sf.errors import VerlSfError
from verl_sf.executor.config import DEFAULT_PRELOAD, ExecutorConfig, IsolationMode
from verl_sf.verl_tool import VerlToolConfig, VerlToolState


def add_arguments(sub: argparse._SubParsersAction) -> None:
    """`verl-sf serve` and its flags (`verl-sf cluster up` takes the same ones)."""
    defaults = ExecutorConfig()
    p = sub.add_parser("serve", help="run the Sandbox Fusion compatible execution server",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed on start)")
    p.add_argument("--slots", "--workers", dest="slots", type=int, default=defaults.slots,
                   help="CPU slots: runs in their first CPU slice at once (--workers is the old name)")
    p.add_argument("--cpu-slice", type=float, default=defaults.cpu_slice_s,
                   help="seconds after which a run gives its slot up and goes on at the lowest CPU priority")
    p.add_argument("--max-in-flight", "--max-queue", dest="max_in_flight", type=int, default=defaults.max_in_flight,
                   help="runs admitted at once (sized from this machine's memory); more get HTTP 503 with Retry-After")
    p.add_argument("--sandboxes", type=int, default=defaults.sandboxes,
                   help="warm interpreters (each in its own sandbox) per library flavor")
    p.add_argument("--max-sessions", type=int, default=defaults.max_sessions,
                   help="live sessions; at the cap the longest-idle one is ended (its next call gets 404)")
    p.add_argument("--session-idle-ttl", type=float, default=defaults.session_idle_ttl_s,
                   help="seconds without a call after which a session ends")
    p.add_argument("--session-max-lifetime", type=float, default=defaults.session_max_lifetime_s)
    p.add_argument("--host-uid-base", type=int, default=defaults.host_uid_base,
                   help="as root: the host uid of a sandbox's root (its runs get this + 1000); never host root")
    p.add_argument("--isolation", choices=[*(m.value for m in IsolationMode), "sandbox"],  # namespaces' old name
                   default=IsolationMode.auto.value,
                   help="auto: the strongest rung this host allows (`verl-sf doctor` says which and why); "
                        "namespaces or landlock: that rung or a refusal to start; none: no isolation at all")
    p.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                   help="run python as `python main.py` per call instead of forking a warm interpreter")
    p.add_argument("--preload", default=",".join(DEFAULT_PRELOAD),
                   help="modules the warm interpreters import up front (missing ones are skipped)")
    p.add_argument("--default-memory-mb", type=int, default=defaults.default_memory_mb,
                   help="memory cap when a request says memory_limit_MB=-1")
    p.add_argument("--output-limit-kb", type=int, default=defaults.output_limit_bytes >> 10,
                   help="stdout and stderr kept per run (each); the rest is cut with a marker")
    p.add_argument("--runs-memory-mb", type=int, default=defaults.runs_memory_mb,
                   help="cap on all runs' memory together (this machine's memory less a reserve)")
    p.add_argument("--workdir-size-mb", type=int, default=defaults.workdir_size_mb)
    p.add_argument("--max-processes", type=int, default=defaults.max_processes,
                   help="processes+threads per run")
    from verl_sf.server.app import ServerConfig

    p.add_argument("--max-body-mb", type=int, default=ServerConfig.max_body_mb,
                   help="larger request bodies get HTTP 413")
    p.add_argument("--max-bodies-mb", type=int, default=ServerConfig.max_bodies_mb,
                   help="request bodies a server process holds at once, their answers not yet sent; past it "
                        "HTTP 503 with Retry-After")
    p.add_argument("--timeout-keep-alive", type=float, default=ServerConfig.timeout_keep_alive,
                   help="seconds a connection may take, from its opening or its last reply, to send a whole "
                        "request header; then it is closed (idle keep-alive and slow headers alike)")
    p.add_argument("--timeout-body", type=float, default=ServerConfig.timeout_body,
                   help="seconds a request body may take to arrive after its header; a slower one gets HTTP 408")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections per server process (default: as many as the open-files limit, raised "
                        "to its hard limit at start, leaves room for); at the cap the longest-waiting one is closed")
    p.add_argument("--list-snapshots", action="store_true",
                   help="answer GET /snapshots with every snapshot's id (only where all clients trust one another: "
                        "an id lets its holder start sessions from the snapshot or delete it)")
    p.add_argument("--gpus", default=defaults.gpus or "none",
                   help="NVIDIA GPUs the cuda and python_gpu languages run on: 'all', indices such as 0,1, or "
                        "'none' (those languages are refused)")
    p.add_argument("--runs-per-gpu", type=int, default=defaults.runs_per_gpu,
                   help="GPU runs sharing one GPU at a time (each holds its slot for its whole run)")
    p.add_argument("--python", default=defaults.python, help="runtime interpreter the code runs with")
    p.add_argument("--verl-tool-state", choices=[s.value for s in VerlToolState], default=VerlToolState.session.value,
                   help="/get_observation: a live interpreter per trajectory, or verl-tool's replay of earlier code")
    p.add_argument("--verl-tool-timeout", type=float, default=VerlToolConfig.run_timeout,
                   help="/get_observation: seconds one turn's code may run")
    p.add_argument("--verl-tool-idle-ttl", type=float, default=VerlToolConfig.idle_ttl_s,
                   help="/get_observation: seconds a trajectory keeps its state without a turn")
    p.add_argument("--e2b-api-key", default=None,
                   help="the only API key E2B SDK clients may send (E2B_API_KEY); by default any non-empty "
                        "key, each its own tenant (sees only the sandboxes it created)")
    p.add_argument("--e2b-max-sandboxes", type=int, default=E2BConfig.max_sandboxes,
                   help="live E2B sandboxes at once (each is a session); past it, creation answers 429")
    p.add_argument("--e2b-max-sandboxes-per-key", type=int, default=None,
                   help="live E2B sandboxes of one API key at once (default: no cap of its own); past it, 429")
    p.add_argument("--e2b-ready-sandboxes", type=int, default=E2BConfig.ready_sandboxes,
                   help="E2B (and Daytona) sandboxes kept started ahead of the creates that take them, once one "
                        "is asked for (each held up to 5 minutes unused); 0: each create starts its own")
    p.add_argument("--daytona-api-key", default=None,
                   help="the API key Daytona SDK clients must send (DAYTONA_API_KEY); by default any non-empty key, "
                        "each key its own tenant")
    p.add_argument("--daytona-max-sandboxes", type=int, default=DaytonaConfig.max_sandboxes,
                   help="started Daytona sandboxes at once (each is a session); past it, creation answers 503")
    p.add_argument("--daytona-minute-s", type=float, default=DaytonaConfig.minute_s,
                   help="seconds in a minute of Daytona's auto-stop and auto-delete intervals (shorten to test them)")
    p.add_argument("--fronts", type=int, default=1,
                   help="server processes sharing the port (SO_REUSEPORT), each with a share of --slots")
    p.add_argument("--fleet-node", default=None,
                   help="set by `verl-sf cluster up`: this server's node tag in the fleet (hex)")
    p.add_argument("--fleet-directory", default=None,
                   help="set by `verl-sf cluster up`: the file listing the fleet's servers, kept by the node actor")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from verl_sf.executor.rungs import IsolationUnavailable
    from verl_sf.server import ServerConfig, run
    from verl_sf.server.fleet import FleetMember

    executor = ExecutorConfig(
        slots=args.slots, cpu_slice_s=args.cpu_slice, max_in_flight=args.max_in_flight, sandboxes=args.sandboxes,
        max_sessions=args.max_sessions, session_idle_ttl_s=args.session_idle_ttl,
        session_max_lifetime_s=args.session_max_lifetime, host_uid_base=args.host_uid_base,
        isolation=IsolationMode(args.isolation),
        fast_path=args.fast_path, preload=tuple(m for m in args.preload.split(",") if m),
        default_memory_mb=args.default_memory_mb, runs_memory_mb=args.runs_memory_mb,
        output_limit_bytes=args.output_limit_kb << 10,
        workdir_size_mb=args.workdir_size_mb, max_processes=args.max_processes, python=args.python,
        gpus=args.gpus, runs_per_gpu=args.runs_per_gpu,
    )
    if args.runs_per_gpu < 1:
        print("verl-sf serve: --runs-per-gpu must be 1 or more", file=sys.stderr)
        return 2
    if args.e2b_ready_sandboxes < 0:
        print("verl-sf serve: --e2b-ready-sandboxes must be 0 or more", file=sys.stderr)
        return 2
    if args.fronts != 1 and args.gpus != "none":
        print("verl-sf serve: --gpus needs --fronts 1 (one process hands the GPU slots out)", file=sys.stderr)
        return 2
    verl_tool = VerlToolConfig(state=VerlToolState(args.verl_tool_state), run_timeout=args.verl_tool_timeout,
                               idle_ttl_s=args.verl_tool_idle_ttl)
    if (args.fleet_node is None) != (args.fleet_directory is None):
        print("verl-sf serve: --fleet-node and --fleet-directory go together", file=sys.stderr)
        return 2
    try:
        fleet = FleetMember(args.fleet_node, Path(args.fleet_directory)) if args.fleet_node is not None else None
    except ValueError as exc:
        print(f"verl-sf serve: --fleet-node: {exc}", file=sys.stderr)
        return 2
    id_prefix = fleet.id_prefix if fleet is not None else ""
    e2b = E2BConfig(api_key=args.e2b_api_key, max_sandboxes=args.e2b_max_sandboxes,
                    max_sandboxes_per_key=args.e2b_max_sandboxes_per_key, ready_sandboxes=args.e2b_ready_sandboxes,
                    id_prefix=id_prefix)
    config = ServerConfig(host=args.host, port=args.port, max_body_mb=args.max_body_mb,
                          max_bodies_mb=args.max_bodies_mb,
                          timeout_keep_alive=args.timeout_keep_alive, timeout_body=args.timeout_body,
                          max_connections=args.max_connections, list_snapshots=args.list_snapshots,
                          executor=executor, verl_tool=verl_tool, e2b=e2b,
                          daytona=DaytonaConfig(api_key=args.daytona_api_key, max_sandboxes=args.daytona_max_sandboxes,
                                                ready_sandboxes=args.e2b_ready_sandboxes,
                                                minute_s=args.daytona_minute_s, id_prefix=id_prefix),
                          fleet=fleet)

    def ready(url: str) -> None:
        print(f"verl-sf {__version__} listening on {url} (isolation: {args.isolation}, slots: {args.slots})",
              flush=True)

    try:
        if args.fronts != 1:
            from verl_sf.server.fronts import run_fronts

            return run_fronts(config, args.fronts, ready, args.log_level)
        run(config, ready)
    except IsolationUnavailable as exc:
        print(f"verl-sf: cannot isolate runs: {exc}", file=sys.stderr)
        return 2
    except VerlSfError as exc:  # FrontsError: a bad --fronts, or a front that could not start
        print(f"verl-sf serve: {exc}", file=sys.stderr)
        return 2
    return 0
