"""A session's root: a helper that starts the session's commands as uid 0 of a user namespace of its own.

E2B's `commands.run(..., user="root")` runs as root.  No run may make a namespace (the seccomp
filter), so the helper is forked by the session's child before that child drops its privileges:
it takes the run's uid, makes a user namespace nested in the sandbox's with that uid as its only
entry (0 inside), then sets no_new_privs and loads the runs' seccomp filter, and runs no user code
itself.  Its capabilities hold in that namespace only, which owns nothing (the mount, PID,
network and IPC namespaces are the sandbox's): on the host and in the sandbox its processes are
the run's uid, and every file the run can touch is all it can touch.

The session's interpreter asks on a SOCK_SEQPACKET socket at `ROOT_FD`: one message per command,
JSON `{"argv", "env", "cwd"}` with three descriptors (stdout, stderr, and the command's status
pipe), answered on the status pipe with a JSON line, `{"pid": n}` or `{"error": text}`, and once
the command has ended `{"exit": code}`.  The helper ends when the interpreter closes its end.
`RootProcess` is the interpreter's side, which the E2B guest (guest.py) uses as it uses a Popen.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import time
from typing import Any, NoReturn, Optional

from . import linux
from .seccomp import Filter

ROOT_FD = 8  # the interpreter's end, where its RootProcess looks for it
NAME = b"verl-sf-root"  # the helper's name from its first instant: the zygote tells it from the interpreter so
MAX_REQUEST = 1 << 20
_channel: Optional[socket.socket] = None  # the interpreter's end, once a command asked for root


class NotStarted(Exception):
    """A root command did not start; `code` is the Connect code the E2B guest answers with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def start(uid: int, gid: int, seccomp: Filter) -> None:
    """Fork the helper (from a child that still has its capabilities) and put our end at ROOT_FD.
    The caller names itself again: the helper is forked with NAME."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    linux.set_name(NAME)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _serve(theirs, uid, gid, seccomp)
        except BaseException as exc:  # the session's stderr, while it is still ours
            with contextlib.suppress(OSError):
                os.write(2, f"verl-sf: the root helper failed: {exc!r}\n".encode())
        os._exit(1)
    theirs.close()
    os.dup2(ours.fileno(), ROOT_FD)  # dup2's copy is inheritable: the interpreter keeps it
    ours.close()


def _serve(channel: socket.socket, uid: int, gid: int, seccomp: Filter) -> NoReturn:
    os.setsid()  # an interrupt of the interpreter's process group never reaches it
    keep = channel.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    if os.geteuid() != uid:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # clears every capability of the sandbox's namespace
        # The uid change made it undumpable, which leaves its /proc files to root: its maps go there.
        linux.check(linux.libc.prctl(linux.PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    linux.user_namespace(uid, gid)
    linux.check(linux.libc.prctl(linux.PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    linux.no_new_privs()
    seccomp.load()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    running: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, the write end of its exit-code pipe)
    poller = select.poll()
    poller.register(keep, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == keep:
                if not _take_request(channel, running, poller):
                    os._exit(0)
                continue
            pid, status_w = running.pop(fd)
            poller.unregister(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            _answer(status_w, {"exit": os.waitstatus_to_exitcode(status)})
            os.close(status_w)


def _take_request(channel: socket.socket, running: dict[int, tuple[int, int]], poller: select.poll) -> bool:
    """Start one command; False once the interpreter is gone.  Its answer goes on its own status pipe
    (whatever else code in the session sends on the socket cannot take or shift another's answer)."""
    try:
        data, fds, _, _ = socket.recv_fds(channel, MAX_REQUEST, 3)
    except OSError:
        return False
    for fd in fds:  # never a command's: it could write its own end (recv_fds drops MSG_CMSG_CLOEXEC)
        os.set_inheritable(fd, False)
    if not data:
        return False
    if len(fds) != 3:  # nowhere to answer
        for fd in fds:
            os.close(fd)
        return True
    out_w, err_w, status_w = fds
    try:
        request = json.loads(data)
        pid = _spawn([str(part) for part in request["argv"]], {str(k): str(v) for k, v in request["env"].items()},
                     str(request["cwd"]), out_w, err_w)
    except Exception as exc:  # its answer: the command did not start
        _answer(status_w, {"error": str(exc) or type(exc).__name__})
        for fd in fds:
            os.close(fd)
        return True
    os.close(out_w)
    os.close(err_w)
    pidfd = os.pidfd_open(pid)
    running[pidfd] = (pid, status_w)
    poller.register(pidfd, select.POLLIN)
    _answer(status_w, {"pid": pid})
    return True


def _answer(status_w: int, answer: dict[str, object]) -> None:
    with contextlib.suppress(OSError):  # its reader is gone
        os.write(status_w, json.dumps(answer).encode() + b"\n")


def _spawn(argv: list[str], env: dict[str, str], cwd: str, out_w: int, err_w: int) -> int:
    """fork and exec as Popen does (a session of its own, stdin from /dev/null); an exec that fails
    raises here, with the reason the child sent on a close-on-exec pipe."""
    if not argv:
        raise ValueError("no command")
    check_r, check_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(check_r)
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.chdir(cwd)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(check_w, f"{argv[0]}: {exc.strerror if isinstance(exc, OSError) else exc}".encode())
        os._exit(127)
    os.close(check_w)
    failure = os.read(check_r, 4096)
    os.close(check_r)
    if failure:
        os.waitpid(pid, 0)
        raise OSError(failure.decode(errors="replace"))
    return pid


class RootProcess:
    """A command started as root by the session's root helper, with what the guest's proc_poll uses of a
    Popen: its pid, its pipes, and its end, which the helper writes as JSON lines on a status pipe of
    the command's own (`{"pid"}` or `{"error"}`, then `{"exit"}`)."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        global _channel
        if _channel is None:
            try:
                _channel = socket.socket(fileno=ROOT_FD)
            except OSError:
                raise NotStarted("permission_denied", "user 'root' is not offered by this sandbox") from None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._status, status_w = os.pipe()
        self._pending = b""
        self.returncode: Optional[int] = None
        try:
            socket.send_fds(_channel, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()],
                            [out_w, err_w, status_w])
        except OSError as exc:
            answer = {"error": f"the root helper is gone ({exc})"}
        else:
            # A helper stopped by the sandbox's own code fails the call, never hangs it.
            answer = self._line(10.0) or {"error": "the root helper did not answer"}
        finally:
            for fd in (out_w, err_w, status_w):
                os.close(fd)
        self.stdout, self.stderr = os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")
        if "pid" not in answer:
            self.stdout.close()
            self.stderr.close()
            os.close(self._status)
            raise NotStarted("invalid_argument", f"the command could not start as root: {answer.get('error')}")
        self.pid = answer["pid"]

    def _line(self, timeout: float) -> Optional[dict[str, Any]]:
        """The next JSON line on the status pipe; None when none came within `timeout`, {} at its end."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            if not select.select([self._status], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            chunk = os.read(self._status, 4096)
            if not chunk:
                return {}
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    def poll(self) -> Optional[int]:
        import subprocess  # here: every zygote imports this module, and `subprocess` brings `threading`

        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float) -> Optional[int]:
        import subprocess

        if self.returncode is None:
            end = self._line(timeout)
            if end is None:
                raise subprocess.TimeoutExpired("root command", timeout)
            exit_code = end.get("exit")
            self.returncode = exit_code if isinstance(exit_code, int) else -signal.SIGKILL  # the helper is gone
            os.close(self._status)
        return self.returncode
