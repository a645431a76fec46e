"""The zygote's side of a session's fork: what it refuses, the forker it runs, the copies it takes on.

The forker (fork.py) is a child of ours, so the key it reads never enters our memory, which every
later run inherits.  It blocks this zygote's loop while it works (milliseconds, plus the copy of
the session's files).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from typing import TYPE_CHECKING, Optional

from . import fork, linux, tracing
from .messages import ForkedSession, SessionForkHead
from .run_groups import Groups
from .session import Session

if TYPE_CHECKING:
    from .supervisor import Zygote


def fork_session(zygote: Zygote, head: SessionForkHead) -> None:
    source = zygote.sessions.get(head["session"])
    refusal = _refusal(zygote, source)
    if refusal is not None or source is None:
        zygote.reply({"id": head["id"], "status": "Error", "busy": source is not None, "session_alive": True,
                      "error": refusal or "the session is not running"})
        return
    made: list[tuple[int, int, list[int]]] = []
    groups: list[Groups] = []
    error = ""
    try:
        for _ in head["ids"]:
            zygote.sequence += 1
            groups.append(zygote.groups.make(zygote.sequence))
            zygote.groups.set_limits(groups[-1], head["limits"])
        made, error = _run_forker(zygote, source, groups, head["freeze"])
    except OSError as exc:
        error = f"verl-sf: the fork could not be set up: {exc}"
    if error or len(made) != len(head["ids"]):
        for init, _, fds in made:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
            for fd in fds:
                os.close(fd)
        for group in groups:
            zygote.groups.release(group, True)
        zygote.reply({"id": head["id"], "status": "Error", "session_alive": True,
                      "error": error or "the forker ended before making every copy"})
        return
    born: list[ForkedSession] = []
    for new_id, (init, interpreter, fds), group in zip(head["ids"], made, groups, strict=True):
        copy = Session.adopt(zygote, new_id, source, head["limits"], init, interpreter, fds, group, head["freeze"])
        born.append({"id": copy.id, "group": zygote.groups.path_of(group)})
    zygote.reply({"id": head["id"], "status": "Finished", "session_alive": True, "sessions": born})


def _refusal(zygote: Zygote, source: Optional[Session]) -> Optional[str]:
    """Why this session cannot be forked now, or None."""
    if source is None or not source.alive:
        return None if source is None else "the session is not running"
    if not zygote.isolated:
        return "forks need the namespaces isolation rung"
    if not tracing.supported():
        return "forks are made on x86-64 only"
    if source.call is not None or source.interpreter < 0:
        return "a call is running in it (a fork never copies a half-run call)"
    threads = len(os.listdir(f"/proc/{source.interpreter}/task"))
    if threads > 1:
        return (f"its interpreter runs {threads} threads; fork(2) copies only the one that takes calls, "
                "so the copies would wait forever on what the others hold")
    background = source.background()
    if background:
        return (f"it has {len(background)} background process(es), which a fork does not copy and which "
                "could reach the copies: end them first")
    return None


def _run_forker(zygote: Zygote, source: Session, groups: list[Groups],
                freeze: bool) -> tuple[list[tuple[int, int, list[int]]], str]:
    """Fork the forker and take, per copy, its PID 1, its interpreter and our ends of its channels."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # In our own PID namespace (children otherwise go to the one made for the next run), where it
    # sees the session's pid as we do.
    linux.check(linux.libc.setns(zygote.pidns_fd, linux.CLONE_NEWPID), "setns(CLONE_NEWPID)")
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.close(zygote.req_fd)
        os.close(zygote.rep_fd)
        fork.fork(zygote.blueprint, source.interpreter, groups, freeze, source.frozen, theirs)
    theirs.close()
    made: list[tuple[int, int, list[int]]] = []
    error = ""
    with ours:
        while True:
            message, fds, _, _ = socket.recv_fds(ours, 4096, len(fork.CHANNELS))
            if not message:
                break
            if message.startswith(b"error "):
                error = f"verl-sf: the fork failed: {message[6:].decode(errors='replace').strip()}"
                continue
            init, interpreter = (int(pid) for pid in message.split())
            made.append((init, interpreter, fds))
    os.waitpid(pid, 0)
    return made, error
