"""`verl-sf doctor`: which isolation rung this host gives this user, what each missing piece would
add, and the exact fix: run it before `verl-sf serve` (inside the container or pod that will serve)."""

from __future__ import annotations

import argparse
import os

from verl_sf.executor.cgroups import CgroupManager
from verl_sf.executor.config import IsolationMode
from verl_sf.executor.rungs import RUNGS, IsolationUnavailable, choose, probe_all


def add_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="which isolation this host gives this user, and how to get more")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(f"verl-sf doctor: isolation for uid {os.geteuid()} on this host, strongest rung first")
    for report in probe_all():
        if not RUNGS[report.rung].confined:
            print("none: always there, never chosen by auto (code runs unisolated; only with --isolation none)")
            continue
        print(f"{report.rung}: {'available' if report.available else 'missing'}")
        for missing in report.missing:
            print(f"  - missing {missing.piece}\n    it adds: {missing.adds}\n    fix: {missing.fix}")
        for note in report.notes:
            print(f"  - note: {note}")
    try:
        rung = choose(IsolationMode.auto)
        print(f"auto would use: {rung.name} ({rung.reason})")
    except IsolationUnavailable as exc:
        print(f"auto would refuse to start: {exc}")
    cgroups = CgroupManager(f"verl-sf-doctor-{os.getpid()}")
    if cgroups.available:
        print(f"cgroups: writable ({'v2' if cgroups.v2 else 'v1'}): a memory and a pids cap per run")
        cgroups.remove()
    else:
        print(f"cgroups: {cgroups.reason}\n  it adds: memory and process caps per run that the kernel enforces "
              "(else rlimits and a watchdog)\n  fix: run the server as root, or in a delegated cgroup v2 subtree "
              "(systemd-run --user --scope -p Delegate=yes verl-sf serve)")
    return 0
