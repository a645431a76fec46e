"""A child process started by the standard library's `subprocess`, its pipes and its exit read by
the running event loop, whichever it is.

Not `asyncio.create_subprocess_exec`: on uvloop (the server's loop) a `preexec_fn` runs in a child
libuv forked, where a sandbox's set-up (mount and user namespaces) fails; `subprocess.Popen` forks
as asyncio's own loop does.  The exit is seen through a pidfd, so no child watcher is involved.

The server adopts orphans (`adopt_orphans`): on the landlock rung no PID namespace ends a zygote's
runs with it, so when one dies (killed from outside) what its runs left comes up to the server,
which kills it (`end_orphans`) before any reply says the sandbox ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Optional

from verl_sf.executor.zygote import linux, procfs

ORPHAN_WAIT_S = 2.0  # the longest the server waits for a dead zygote's orphans to end, once killed
_started: set[int] = set()
"""The children spawned here and not yet collected: never taken for orphans."""
_adopting = False


def adopt_orphans() -> None:
    """This process (the server) becomes a subreaper: orphans below it come to it, not to init."""
    global _adopting
    linux.become_subreaper()
    _adopting = True


def end_orphans() -> None:
    """SIGKILL and collect every child of this process that it did not spawn, until none is left
    (each one killed hands its own children up) or `ORPHAN_WAIT_S` has passed."""
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while _adopting and time.monotonic() < deadline:
        orphans = [pid for pid in procfs.children(os.getpid()) if pid not in _started]
        if not orphans:
            return
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # a killed process takes a moment to exit (its memory is torn down)
        for pid in orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


class ChildProcess:
    def __init__(self, popen: subprocess.Popen[bytes], stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader):
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: Optional[int] = None
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = self._popen.wait()  # it has exited: this only collects it
        _started.discard(self.pid)
        self._exited.set_result(self.returncode)

    def send_signal(self, sig: int) -> None:
        """Signal it unless it is collected already (its pid may be another process's by now)."""
        if self.returncode is None:
            self._popen.send_signal(sig)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class _PipeReader(asyncio.StreamReaderProtocol):
    def eof_received(self) -> bool:
        super().eof_received()
        return False  # the pipe closes at its end (uvloop keeps it open when told True, as for a socket)


async def spawn(argv: Sequence[str], env: dict[str, str], preexec_fn: Callable[[], None], pass_fds: Sequence[int],
                limit: int) -> ChildProcess:
    """Start `argv` with pipes on its stdin and stdout (`limit`: the longest line its stdout may send)."""
    popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, preexec_fn=preexec_fn,
                             pass_fds=tuple(pass_fds), bufsize=0)
    _started.add(popen.pid)
    assert popen.stdin is not None and popen.stdout is not None
    loop = asyncio.get_running_loop()
    stdout = asyncio.StreamReader(limit=limit, loop=loop)
    await loop.connect_read_pipe(lambda: _PipeReader(stdout, loop=loop), popen.stdout)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, popen.stdin)
    stdin = asyncio.StreamWriter(transport, protocol, None, loop)
    return ChildProcess(popen, stdin, stdout)
