"""The suite ends with nothing of its own left running: a server, zygote, Ray process or cgroup
that a test leaves behind slows and skews every test after it, so the run fails naming it.

Every process the suite starts inherits a marker in its environment; at the end none may live
(sandboxed processes have a scrubbed environment, but die with their server).  The cgroups
(`verl-sf-<server pid>-*`) of the servers the suite started must be gone with their servers."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

MARKER = "VERL_SF_TEST_RUN"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SETTLE_S = 30.0  # what stopping a server or Ray may take on a loaded machine
SERVERS: set[int] = set()
"""The pids of the servers the suite started (tests/server_fixtures.py adds them)."""


def _server_cgroups() -> list[str]:
    found = []
    for controller in ("memory", "pids", "cpu", "cpuacct", ""):
        base = CGROUP_ROOT / controller if controller else CGROUP_ROOT
        found.extend(str(group) for pid in SERVERS for group in base.glob(f"verl-sf-{pid}-*"))
    return sorted(found)


def _marked_processes(token: str) -> list[str]:
    needle = f"{MARKER}={token}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {command[:160]}")
        except OSError:
            continue
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[MARKER] = secrets.token_hex(8)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    token = os.environ.get(MARKER, "")
    deadline = time.monotonic() + SETTLE_S
    while True:
        processes = _marked_processes(token)
        groups = _server_cgroups()
        if not processes and not groups or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if processes or groups:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the suite left these running:", *processes, *groups]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

