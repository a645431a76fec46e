"""The zygote's side of a session's fork: what it refuses, the forker it runs, the copies it takes on.

The forker (forker.py) is a throwaway child of ours that traces the session.  It works while our loop
goes on (copying a session's files takes as long as they are big): its socket is polled like a
job's pipes, and its end answers the request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from typing import Optional, Protocol

from . import forker, tracing
from .child import Blueprint
from .job import JobHost
from .messages import ForkedSession, SessionForkHead
from .run_groups import Groups
from .session import SessionJob


class ForkHost(JobHost, Protocol):
    """What a fork needs of the zygote (supervisor.Zygote)."""

    blueprint: Blueprint
    sequence: int
    req_fd: int
    rep_fd: int

MAX_FORK_LAYERS = 16  # Landlock domains a process may stack: a live session gets one per fork


class Forking:
    """One fork request in progress."""

    def __init__(self, zygote: ForkHost, head: SessionForkHead, source: SessionJob):
        self.head = head
        self.source = source
        self.groups: list[Groups] = []
        self.made: list[tuple[int, int, list[int]]] = []  # per copy: its PID 1, its interpreter, our channel ends
        self.error = ""
        self.busy = False  # refused for the session's state, not a fault
        self.limit = False  # a process of a copy met the account's process limit
        try:
            for _ in head["ids"]:
                zygote.sequence += 1
                self.groups.append(zygote.groups.make(zygote.sequence))
                zygote.groups.set_limits(self.groups[-1], head["limits"])
        except OSError:
            for group in self.groups:
                zygote.groups.release(group, True)
            raise
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            ours.close()
            os.close(zygote.req_fd)
            os.close(zygote.rep_fd)
            forker.fork(zygote.blueprint, source.interpreter, self.groups, head["freeze"], source.frozen, theirs)
        theirs.close()
        self.socket = ours
        source.forking = True

    def on_event(self, zygote: ForkHost, fd: int) -> None:
        message, fds, _, _ = socket.recv_fds(self.socket, 4096, len(forker.CHANNELS))
        if message.startswith((b"error ", b"busy ", b"limit ")):
            kind, _, text = message.partition(b" ")
            self.error = text.decode(errors="replace").strip()
            self.busy = kind == b"busy"
            self.limit = kind == b"limit"
        elif message:
            init, interpreter = (int(pid) for pid in message.split())
            self.made.append((init, interpreter, fds))
            return
        if not message:
            self._finish(zygote)

    def _finish(self, zygote: ForkHost) -> None:
        zygote.unwatch(self.socket.fileno())
        self.socket.close()
        os.waitpid(self.pid, 0)
        self.source.forking = False
        head, source = self.head, self.source
        if self.error or len(self.made) != len(head["ids"]) or not source.alive:
            error = (f"the session ended while it was being forked ({self.error})" if not source.alive
                     else self.error or "the forker ended before making every copy")
            self._fail(zygote, error if self.busy or self.limit else f"verl-sf: the fork failed: {error}")
            return
        pidfds = self._hold_copies()
        if pidfds is None:
            self.busy = True  # the session's own doing: a seccomp filter or a stack limit its code set, say
            self._fail(zygote, "a copy ended as it started: what the session's code set up in its interpreter "
                               "(its own seccomp filter, a stack limit) lets no copy of it run")
            return
        if not source.frozen:
            source.layers += 1
        born: list[ForkedSession] = []
        for new_id, made, group, held in zip(head["ids"], self.made, self.groups, pidfds, strict=True):
            init, interpreter, fds = made
            copy = SessionJob.adopt(zygote, new_id, source, head["limits"], init, interpreter, fds, group,
                                    head["freeze"], held)
            born.append({"id": copy.id, "group": zygote.groups.path_of(group)})
        zygote.reply({"kind": "fork", "id": head["id"], "status": "Finished", "session_alive": True, "sessions": born})

    def _hold_copies(self) -> Optional[list[tuple[int, int]]]:
        """A pidfd of each copy's PID 1 and interpreter, or None when one of them is gone already."""
        held: list[int] = []
        try:
            for init, interpreter, _ in self.made:
                held.append(os.pidfd_open(init))
                held.append(os.pidfd_open(interpreter))
        except ProcessLookupError:
            for fd in held:
                os.close(fd)
            return None
        return list(zip(held[::2], held[1::2], strict=True))

    def _fail(self, zygote: ForkHost, error: str) -> None:
        """No copy is kept: each one made is killed, its channels and group let go."""
        for init, _, fds in self.made:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
            for fd in fds:
                os.close(fd)
        for group in self.groups:
            zygote.groups.release(group, True)
        zygote.reply({"kind": "fork", "id": self.head["id"], "status": "Error", "busy": self.busy, "limit": self.limit,
                      "session_alive": self.source.alive, "error": error})


def fork_session(zygote: ForkHost, head: SessionForkHead) -> None:
    source = zygote.sessions.get(head["session"])
    refusal = _refusal(zygote, source)
    if refusal is not None or source is None:
        zygote.reply({"kind": "fork", "id": head["id"], "status": "Error", "busy": source is not None,
                      "session_alive": True, "error": refusal or "the session is not running"})
        return
    over = _over_budget(zygote, source, head)
    if over is not None:
        zygote.reply({"kind": "fork", "id": head["id"], "status": "Error", "limit": True, "session_alive": True,
                      "error": over})
        return
    try:
        forking = Forking(zygote, head, source)
    except OSError as exc:
        zygote.reply({"kind": "fork", "id": head["id"], "status": "Error", "session_alive": True,
                      "error": f"verl-sf: the fork could not be set up: {exc}"})
        return
    zygote.watch(forking, (forking.socket.fileno(),))


def _refusal(zygote: ForkHost, source: Optional[SessionJob]) -> Optional[str]:
    """Why this session cannot be forked now, or None."""
    if source is None or not source.alive:
        return None if source is None else "the session is not running"
    if not zygote.isolated:
        return "forks need the namespaces isolation rung"
    if not tracing.supported():
        return "forks are made on x86-64 only"
    if source.rooted:  # a copy would hold the parent's root helper, in the parent's namespaces
        return "its commands may run as root (an E2B sandbox): such a session is not forked"
    if source.call is not None or source.interpreter < 0 or source.forking:
        return "a call is running in it (a fork never copies a half-run call)"
    if not source.frozen and source.layers >= MAX_FORK_LAYERS - 1:
        return (f"it is in {source.layers} Landlock domains, as many as a live session can be (each fork or "
                "snapshot puts it in one more, a live copy starts one deeper than its parent, and Linux stacks 16): "
                "start sessions from a snapshot taken earlier instead (a session started from a snapshot starts "
                "one domain deeper)")
    if "memory" not in source.groups and source.limits["memory"]:  # a copy's files would be counted nowhere
        files = _files_bytes(zygote, source)
        if files > source.limits["memory"]:
            return (f"its files take {files >> 20} MB, more than its memory limit of {source.limits['memory'] >> 20} "
                    "MB, and this server has no memory cgroup to charge a copy's files to: remove some first")
    return None  # its threads and processes are checked by the forker, with the interpreter stopped


def _over_budget(zygote: ForkHost, source: SessionJob, head: SessionForkHead) -> Optional[str]:
    """Why the copies' files would not fit in what is left of the cap over all runs and sessions, or None.
    Each copy gets its own copy of them (its memory pages are shared until written, and not counted here)."""
    files = _files_bytes(zygote, source)
    wanted = files * len(head["ids"])
    if not files or wanted <= head["files_budget"]:
        return None
    return (f"its files take {files >> 20} MB, and {len(head['ids'])} copies of them ({wanted >> 20} MB) would not "
            f"fit in the {head['files_budget'] >> 20} MB left of the server's cap over all runs and sessions "
            "(--runs-memory-mb): ask for fewer copies, or remove files first")


def _files_bytes(zygote: ForkHost, source: SessionJob) -> int:
    """What the session's own tmpfs mounts hold."""
    total = 0
    for target in zygote.blueprint.tmpfs_targets:
        with contextlib.suppress(OSError):
            fs = os.statvfs(f"/proc/{source.pid}/root{target}")
            total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return total
