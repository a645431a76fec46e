"""The suite ends with nothing of its own left running: a server, zygote, Ray process or cgroup
that a test leaves behind slows and skews every test after it, so the run fails naming it.

Every process the suite starts inherits a marker in its environment; at the end none may live
(sandboxed processes have a scrubbed environment, but die with their server).  The servers'
cgroups (`verl-sf-<server pid>-*`) made during the run must be gone with their servers."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

MARKER = "VERL_SF_TEST_RUN"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SETTLE_S = 30.0  # what stopping a server or Ray may take on a loaded machine
_before = pytest.StashKey[set[Path]]()


def _server_cgroups() -> set[Path]:
    found: set[Path] = set()
    for controller in ("memory", "pids", ""):
        base = CGROUP_ROOT / controller if controller else CGROUP_ROOT
        found.update(base.glob("verl-sf-*"))
    return found


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
    session.config.stash[_before] = _server_cgroups()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    token = os.environ.get(MARKER, "")
    before = session.config.stash.get(_before, set())
    deadline = time.monotonic() + SETTLE_S
    while True:
        processes = _marked_processes(token)
        groups = sorted(str(group) for group in _server_cgroups() - before if group.exists())
        if not processes and not groups or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if processes or groups:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the suite left these running:", *processes, *groups]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

