"""A child process started by the standard library's `subprocess`, its pipes and its exit read by
the running event loop, whichever it is.

Not `asyncio.create_subprocess_exec`: on uvloop (the server's loop) a `preexec_fn` runs in a child
libuv forked, where a sandbox's set-up (mount and user namespaces) fails; `subprocess.Popen` forks
as asyncio's own loop does.  The exit is seen through a pidfd, so no child watcher is involved.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable, Sequence
from typing import Optional


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
    assert popen.stdin is not None and popen.stdout is not None
    loop = asyncio.get_running_loop()
    stdout = asyncio.StreamReader(limit=limit, loop=loop)
    await loop.connect_read_pipe(lambda: _PipeReader(stdout, loop=loop), popen.stdout)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, popen.stdin)
    stdin = asyncio.StreamWriter(transport, protocol, None, loop)
    return ChildProcess(popen, stdin, stdout)
