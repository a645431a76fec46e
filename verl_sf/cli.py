"""`verl-sf`: one entry point, one subcommand per job (serve, rollout, languages, doctor, cluster)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from verl_sf import __version__, doctor_cli, serve_cli
from verl_sf.cluster import cli as cluster_cli


def _add_rollout(sub: argparse._SubParsersAction) -> None:
    from verl_sf.rollout.cli import add_arguments, run

    p = sub.add_parser("rollout", help="multi-turn tool rollouts against an OpenAI-compatible model server")
    add_arguments(p)
    p.set_defaults(func=run)


def _add_languages(sub: argparse._SubParsersAction) -> None:
    from verl_sf.languages_cli import add_arguments

    add_arguments(sub.add_parser("languages", help="list the Sandbox Fusion languages here, or install them"))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-sf", description=__doc__)
    parser.add_argument("--version", action="version", version=f"verl-sf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cli.add_arguments(sub)
    _add_rollout(sub)
    _add_languages(sub)
    doctor_cli.add_arguments(sub)
    cluster_cli.add_arguments(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
