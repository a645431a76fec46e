"""The host's own view of a server's processes (its /proc), for tests that must not trust the sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.waiting import wait_until

if TYPE_CHECKING:
    from verl_sf.executor import Executor


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def host_uid(pid: int) -> int:
    status = _read(f"/proc/{pid}/status")
    return int(status.split("\nUid:\t", 1)[1].split()[0]) if "\nUid:\t" in status else -1


def kill_queued(pid: int) -> bool:
    """Whether SIGKILL is pending for `pid` (it runs no more of its own code, only its exit); False if gone."""
    status = _read(f"/proc/{pid}/status")
    pending = [line.split()[1] for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(int(mask, 16) & 1 << 8 for mask in pending)


def killed_by_reply(pids: list[int], what: str) -> None:
    """Processes of a run still on the host once its reply came: each has SIGKILL queued (it runs no
    more of its code; #38: a reply waits for the kill, not for the exit) and is gone soon after."""
    assert all(kill_queued(pid) or _gone(pid) for pid in pids), f"{what}: not killed by the reply: {pids}"
    wait_until(lambda: all(_gone(pid) for pid in pids), 5, f"{what}: the killed processes to end")


def _gone(pid: int) -> bool:
    return not _read(f"/proc/{pid}/cmdline")  # a zombie's is empty too: its exit is done


def comm(pid: int) -> str:
    return _read(f"/proc/{pid}/comm").strip()


def named(name: str) -> list[int]:
    """Every process on the host whose name (comm) is `name`, whoever's child it is now."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and comm(int(entry.name)) == name]


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system, every thread) the processes `pids` have used; a gone one counts 0."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state first); [] once it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split() if stat else []


def descendants(root: int) -> dict[int, int]:
    """{pid: parent pid} of every process below `root`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat_fields(int(entry.name)) if entry.name.isdigit() else []
        if fields:
            parents[int(entry.name)] = int(fields[1])
    below: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in below:
                below[pid] = ppid
                frontier.append(pid)
    return below


def _interpreter(pid: int) -> bool:
    """A python started by the zygote bootstrap, or forked from one (bwrap's own argv holds it too)."""
    try:
        return comm(pid) != "bwrap" and b"from zygote.main import main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def zygotes(server_pid: int) -> list[int]:
    """A server's warm interpreters (under bwrap, or straight under the server on the landlock rung);
    their forked children carry the same command line, below one.  A process being killed is none:
    a session ended just before (its reply leaves before its teardown) can be an interpreter whose
    PID 1 is gone, handed to bwrap for the moments of its exit."""
    tree = descendants(server_pid)
    return [pid for pid, ppid in tree.items() if _interpreter(pid) and not _interpreter(ppid) and not _ending(pid)]


PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit
SIGKILL_BIT = 1 << 8  # signal 9 in /proc/<pid>/status's pending masks


def _ending(pid: int) -> bool:
    fields = _stat_fields(pid)
    if not fields or int(fields[6]) & PF_EXITING:  # stat's 9th field, flags
        return True
    status = _read(f"/proc/{pid}/status") or ""
    pending = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & SIGKILL_BIT for mask in pending)


def session_zygote(executor: Executor, session_id: str) -> int:
    """The zygote holding a session of an in-process executor (other servers' may run beside it)."""
    process = executor.sessions[session_id].zygote.process
    assert process is not None
    [zygote] = zygotes(process.pid)
    return zygote


def run_processes(server_pid: int) -> list[int]:
    """Processes of a server's runs: below a zygote, but for its template (verl-sf-templat), the
    children it forks ahead of the next run (named verl-sf-ready until it has one) and such a
    child's root helper."""
    tree = descendants(server_pid)
    warm = set(zygotes(server_pid))
    runs = []
    for pid in tree:
        ancestor = tree.get(pid)
        while ancestor is not None and ancestor not in warm:
            ancestor = tree.get(ancestor)
        if ancestor is not None and "verl-sf-ready" not in (comm(pid), comm(tree[pid])) \
                and comm(pid) != "verl-sf-templat":
            runs.append(pid)
    return runs
