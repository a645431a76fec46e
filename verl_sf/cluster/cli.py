"""`verl-sf cluster up|status|down`: a sandbox server on every Ray node, placed and supervised by Ray.

    verl-sf cluster up [--address ADDR] [--resource NAME] [serve flags, e.g. --slots 16]
    verl-sf cluster status [--address ADDR] [--json]
    verl-sf cluster down [--address ADDR]

`--address` means what it means for `ray status`: a GCS address, else RAY_ADDRESS, else `auto`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from verl_sf import serve_cli
from verl_sf.cluster.names import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from verl_sf.cluster.fleet import ServerStatus

# Chosen per node by the server actor (the node's IP, a free port).
PER_NODE_FLAGS = ("host", "port")


def _serve_parser() -> argparse.ArgumentParser:
    """`verl-sf serve`'s own parser: `cluster up` takes exactly its flags, so the two never drift."""
    sub = argparse.ArgumentParser(add_help=False).add_subparsers()
    serve_cli.add_arguments(sub)
    serve: argparse.ArgumentParser = sub.choices["serve"]
    for action in serve._actions:
        if action.dest in PER_NODE_FLAGS:
            action.help = argparse.SUPPRESS
    return serve


def serve_args_from(args: argparse.Namespace, serve: argparse.ArgumentParser) -> list[str]:
    """The serve flags a user gave to `cluster up`, as argv for each node's `verl-sf serve`."""
    argv: list[str] = []
    for action in serve._actions:
        if not action.option_strings or action.dest in ("help", *PER_NODE_FLAGS):
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        if action.nargs == 0:  # store_true / store_false: the flag alone says it
            argv.append(action.option_strings[0])
        else:
            argv += [action.option_strings[0], str(value)]
    return argv


def add_arguments(sub: argparse._SubParsersAction) -> None:
    serve = _serve_parser()
    cluster = sub.add_parser("cluster", help="a sandbox server on every Ray node (up, status, down)",
                             description=__doc__.split("\n\n")[0])
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    up = actions.add_parser("up", parents=[serve], conflict_handler="resolve",
                            help="place one server per node (or per node carrying --resource)",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    up.add_argument("--resource", help="only nodes with some of this Ray resource get a server, e.g. 'sandbox'")
    up.set_defaults(func=lambda args: _up(args, serve))
    status = actions.add_parser("status", help="per server: node, URL, health, rung, slots, in flight, sessions")
    status.add_argument("--json", action="store_true", help="one JSON object per server instead of a table")
    status.set_defaults(func=_status)
    down = actions.add_parser("down", help="stop every server and remove the fleet's actors")
    down.set_defaults(func=_down)
    for parser in (up, status, down):
        parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else auto)")
        parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="Ray namespace the fleet's actors live in")


def _up(args: argparse.Namespace, serve: argparse.ArgumentParser) -> int:
    from verl_sf.cluster import fleet

    for flag in PER_NODE_FLAGS:
        if getattr(args, flag) != serve.get_default(flag):
            print(f"verl-sf cluster up: --{flag} is chosen per node (the node's IP, a free port)", file=sys.stderr)
            return 2
    fleet.connect(args.address, args.namespace)
    try:
        rows = fleet.up(args.namespace, args.resource, serve_args_from(args, serve))
    except fleet.FleetError as exc:
        print(f"verl-sf cluster up: {exc}", file=sys.stderr)
        return 2
    print(format_table(rows))
    return 0 if rows and all(row.health == "ok" for row in rows) else 1


def _status(args: argparse.Namespace) -> int:
    from verl_sf.cluster import fleet

    fleet.connect(args.address, args.namespace)
    rows = fleet.status(args.namespace)
    if args.json:
        for row in rows:
            print(json.dumps(dataclasses.asdict(row)))
    else:
        print(format_table(rows) if rows else f"no sandbox servers in namespace {args.namespace!r}")
    return 0 if rows and all(row.health == "ok" for row in rows) else 1


def _down(args: argparse.Namespace) -> int:
    from verl_sf.cluster import fleet

    fleet.connect(args.address, args.namespace)
    print(f"stopped {fleet.down(args.namespace)} sandbox server(s)")
    return 0


def format_table(rows: Sequence[ServerStatus]) -> str:
    header = ("NODE", "URL", "HEALTH", "ISOLATION", "SLOTS", "IN FLIGHT", "QUEUED", "SESSIONS", "RESTARTS")
    lines = [header] + [(row.node_id[:12], row.url or "-", row.health, *(_cell(v) for v in (
        row.isolation, row.slots, row.in_flight, row.queued, row.sessions, row.restarts))) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)
