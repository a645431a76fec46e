"""ProcessMode's executor: long-lived child processes, one call per child at a time.

Not `concurrent.futures.ProcessPoolExecutor`: there a child that crashes breaks the whole
pool (every other call in flight fails too), and a running call cannot be stopped.  Here a
crash costs exactly the call that caused it, a cancelled call kills its child, and lost
children are replaced on demand.  Children are plain subprocesses (`python
verl_sf/pool/_child.py`), not forks of the Ray worker, whose threads make fork unsafe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle

from verl_sf.errors import VerlSfError
from verl_sf.pool import _child


class ExecutionCrashed(VerlSfError, RuntimeError):
    """The pool process running `fn` died (e.g. a segfault or `os._exit`) before answering."""


class _Child:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def call(self, payload: bytes) -> Any:
        """The reply; IncompleteReadError once the process has exited without one, though a
        process `fn` forked may hold the pipe open after it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(_child.HEADER.pack(len(payload)) + payload)
        await self.proc.stdin.drain()
        reply = asyncio.ensure_future(self._reply())
        exited = asyncio.ensure_future(self.proc.wait())
        try:
            await asyncio.wait((reply, exited), return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
            if not reply.done():
                reply.cancel()
        if not reply.done() or reply.cancelled():
            raise asyncio.IncompleteReadError(b"", None)
        return reply.result()

    async def _reply(self) -> Any:
        assert self.proc.stdout is not None
        (size,) = _child.HEADER.unpack(await self.proc.stdout.readexactly(_child.HEADER.size))
        return cloudpickle.loads(await self.proc.stdout.readexactly(size))

    async def reap(self) -> None:
        """Collect a child whose pipe closed.  Not kill(): Popen.send_signal polls first
        and would steal the exit status from asyncio's child watcher."""
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=5)
        except asyncio.TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()

    async def close(self) -> None:
        """Ask politely (EOF on stdin), then insist."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=5)
        except asyncio.TimeoutError:
            await self.kill()


class ProcessRunner:
    """Runs picklable sync callables in up to `size` child processes."""

    def __init__(self, size: int):
        self._size = size
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._spawning = 0
        self._available: asyncio.Condition | None = None

    async def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        payload = cloudpickle.dumps((fn, args, kwargs))  # a pickling error is the caller's, raised here
        child = await self._checkout()
        try:
            outcome, value = await child.call(payload)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await child.reap()
            await self._discard(child)
            raise ExecutionCrashed(
                f"pool process {child.pid} running {function_name(fn)} exited with "
                f"{_describe_exit(child.proc.returncode)} before returning a result") from exc
        except BaseException:
            # Cancelled (or worse) mid-call: the child is in an unknown state; stop it.
            await asyncio.shield(self._kill_and_discard(child))
            raise
        await self._checkin(child)
        if outcome == "err":
            raise value
        return value

    def pids(self) -> list[int]:
        return [child.pid for child in (*self._idle, *self._busy)]

    async def close(self) -> None:
        children = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        await asyncio.gather(*(child.close() for child in children), return_exceptions=True)

    # ---- internals --------------------------------------------------------------------

    def _condition(self) -> asyncio.Condition:
        if self._available is None:
            self._available = asyncio.Condition()
        return self._available

    async def _checkout(self) -> _Child:
        async with self._condition():
            while True:
                if self._idle:
                    child = self._idle.pop()
                    if child.proc.returncode is None:
                        self._busy.add(child)
                        return child
                    continue  # died while idle (e.g. killed from outside): forget it
                if len(self._busy) + self._spawning < self._size:
                    break
                await self._condition().wait()
            self._spawning += 1
        try:
            child = _Child(await _spawn())
        finally:
            self._spawning -= 1
        self._busy.add(child)
        return child

    async def _checkin(self, child: _Child) -> None:
        async with self._condition():
            self._busy.discard(child)
            self._idle.append(child)
            self._condition().notify()

    async def _discard(self, child: _Child) -> None:
        async with self._condition():
            self._busy.discard(child)
            self._condition().notify()

    async def _kill_and_discard(self, child: _Child) -> None:
        await child.kill()
        await self._discard(child)


async def _spawn() -> asyncio.subprocess.Process:
    env = dict(os.environ)
    # The child must import whatever `fn` was pickled by reference from (the driver's
    # modules reach Ray workers through sys.path, not through the environment).
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    # Run by path, not `-m verl_sf.pool._child`: that would import this package (and Ray)
    # into every child first.
    return await asyncio.create_subprocess_exec(
        sys.executable, _child.__file__,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)


def function_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _describe_exit(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"
