"""One warm interpreter in its sandbox, seen from the server: requests out, replies matched by id.

A zygote runs many jobs at once; each request line carries an id and its reply comes back with
it, in completion order.  Replies nobody waits for any more (a cancelled run) are dropped; an
unprompted reply for a session (it died between calls) goes to `on_session_end`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Optional, Union

from verl_sf.errors import VerlSfError
from verl_sf.executor.cgroups import SandboxCgroup
from verl_sf.executor.child_process import ChildProcess, end_orphans, spawn
from verl_sf.executor.jobs import next_id
from verl_sf.executor.reply_lines import ReplyLines
from verl_sf.executor.sandbox import SandboxLauncher
from verl_sf.executor.zygote.messages import (
    CallReply,
    ClosedReply,
    FailedReply,
    ForkReply,
    Head,
    Reply,
    RunBody,
    RunHead,
    RunReply,
    SessionCallBody,
    SessionCallHead,
    SessionForkHead,
    SessionOpenHead,
    SessionReply,
)
from verl_sf.json_pieces import decode
from verl_sf.off_loop import OFF_LOOP_BYTES, json_bytes, off_loop, text_size

log = logging.getLogger(__name__)
MAX_REPLY_BYTES = 512 << 20  # far past what the zygote lets a reply carry (it caps every channel)
CLOSE_WAIT = 10.0  # seconds a session's end waits for the zygote to have killed it
SHUTDOWN_WAIT = 5.0  # seconds a zygote on the landlock rung gets to end its runs as the server stops
Closing = asyncio.Future  # a session's end: done once every process of it is killed
Closed = Union[ClosedReply, FailedReply]


class SandboxCrashed(VerlSfError, RuntimeError):
    """A zygote died with jobs in flight (e.g. killed from outside); it is restarted."""


class ZygoteProcess:
    def __init__(self, name: str, flavor: str, launcher: SandboxLauncher, cgroup: Optional[SandboxCgroup],
                 on_session_end: Callable[[int, str], None]):
        self.name = name
        self.flavor = flavor
        self.launcher = launcher
        self.cgroup = cgroup
        self.on_session_end = on_session_end
        self.process: Optional[ChildProcess] = None
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        self.sessions: set[int] = set()
        self._reader: Optional[asyncio.Task[None]] = None
        self._closed = False  # stopped for good: a late request must not start it again
        self._starting: Optional[asyncio.Task[None]] = None
        self.fault = ""  # why the last reader failed, until a restarted zygote answers again
        # Requests made in one turn of the event loop leave in one write: each write wakes the zygote.
        self._outgoing: list[bytes] = []

    @property
    def load(self) -> int:
        return len(self.pending)

    async def ensure_started(self) -> None:
        """A zygote takes requests once its start is done, not once its process exists: until its hello
        is read and its cgroup settled (v2: its run groups have no caps' files before), none is sent."""
        if self._starting is None or self._starting.done():
            if self.process is not None and self.process.returncode is None:
                return
            if self._closed:
                raise SandboxCrashed(f"sandbox {self.name} ({self.flavor}) is stopped: the server is shutting down")
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        procs = self.cgroup.procs_files if self.cgroup else []
        if self.cgroup:
            self.cgroup.prepare()
        # The zygote reaches its delegated cgroups through these descriptors, never through a path.
        fds = {c: os.open(d, os.O_RDONLY | os.O_DIRECTORY) for c, d in self.cgroup.dirs.items()} if self.cgroup else {}
        config_fd = os.memfd_create("zygote-config", os.MFD_CLOEXEC)
        try:
            self.process = await spawn(
                self.launcher.command(self.name, self.flavor, fds, self.cgroup, config_fd),
                env=self.launcher.env, preexec_fn=self.launcher.preexec(procs),
                pass_fds=(*fds.values(), config_fd), limit=MAX_REPLY_BYTES)
        finally:
            for fd in (*fds.values(), config_fd):
                os.close(fd)
        line = await self.process.stdout.readline()
        hello = json.loads(line) if line else {}
        if hello.get("kind") != "ready":
            code = await self.process.wait()
            raise SandboxCrashed(f"sandbox {self.name} ({self.flavor}) failed to start (exit code {code})")
        if self.cgroup:
            self.cgroup.settle()
        self._reader = asyncio.create_task(self._read_replies(self.process))

    async def _read_replies(self, process: ChildProcess) -> None:
        """Replies until the zygote exits.  A reader that fails (a reply it cannot take) kills its
        zygote: what was in flight fails as a sandbox error and the next request starts a new one."""
        try:
            await self._take_replies(process)
        except Exception as exc:  # noqa: BLE001 - any failure here must end in a restart, never a hang
            self.fault = f"sandbox {self.name} ({self.flavor}): its reply reader failed ({exc!r}); restarting it"
            log.error("verl-sf: %s", self.fault)
            process.send_signal(signal.SIGKILL)
        code = await process.wait()
        end_orphans()  # what its runs left, where no PID namespace took it: before any reply says it ended
        self._fail_all("the server is shutting down" if self._closed else
                       f"sandbox {self.name} ({self.flavor}) exited (code {code})")

    async def _take_replies(self, process: ChildProcess) -> None:
        lines = ReplyLines(process.stdout, MAX_REPLY_BYTES)
        while True:
            line = await lines.next()
            if not line:
                return
            self.fault = ""
            reply: Reply = await off_loop(len(line), _reply_of, line)
            future = self.pending.pop(reply.get("id", -1), None)
            if future is not None:
                if not future.done():
                    future.set_result(reply)
            elif reply["kind"] == "session" and "session_end" in reply and reply["id"] in self.sessions:
                self.sessions.discard(reply["id"])
                self.on_session_end(reply["id"], reply["session_end"])

    def _fail_all(self, why: str) -> None:
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(SandboxCrashed(why))
        sessions, self.sessions = self.sessions, set()
        for session in sessions:
            self.on_session_end(session, "the sandbox holding it crashed")

    async def run(self, head: RunHead, body: bytes) -> Union[RunReply, FailedReply]:
        """Run a job; a cancelled wait kills it."""
        reply = await self._request(head, body)
        if reply["kind"] == "run" or reply["kind"] == "failed":
            return reply
        raise self._unexpected(head, reply)

    async def call(self, head: SessionCallHead, body: bytes) -> Union[CallReply, FailedReply]:
        """A call in a session; a cancelled wait interrupts it as at its time-out."""
        reply = await self._request(head, body)
        if reply["kind"] == "call" or reply["kind"] == "failed":
            return reply
        raise self._unexpected(head, reply)

    def _unexpected(self, head: Head, reply: Reply) -> SandboxCrashed:
        return SandboxCrashed(f"sandbox {self.name} answered a {head['op']!r} request with a {reply['kind']!r} reply")

    async def _request(self, head: Head, body: bytes = b"") -> Reply:
        """Send one request and wait for its reply; a cancelled wait cancels the job (a run is
        killed, a session call interrupted as at its time-out)."""
        await self.ensure_started()
        job_id = head["id"]
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending[job_id] = future
        try:
            self._write(head, body)
            return await future
        except asyncio.CancelledError:
            self.pending.pop(job_id, None)
            if head["op"] == "run":
                self.send({"op": "cancel", "id": job_id})
            raise

    async def open_session(self, head: SessionOpenHead, body: RunBody) -> Union[SessionReply, FailedReply]:
        """Open a session; until its reply it is this zygote's already (a sandbox crash ends it too)."""
        self.sessions.add(head["id"])
        reply = await self._request(head, await encode_body(body))
        if reply["kind"] == "session" and reply["session_alive"]:
            return reply
        self.sessions.discard(head["id"])
        if reply["kind"] == "session" or reply["kind"] == "failed":
            return reply
        raise self._unexpected(head, reply)

    async def fork_session(self, head: SessionForkHead) -> Union[ForkReply, FailedReply]:
        """Fork a session; its copies are this zygote's sessions from the reply on."""
        reply = await self._request(head)
        if reply["kind"] == "fork":
            self.sessions.update(copy["id"] for copy in reply.get("sessions", []))
            return reply
        if reply["kind"] == "failed":
            return reply
        raise self._unexpected(head, reply)

    def close_session(self, open_id: int) -> Closing[Closed]:
        """End a session; the future is done once every process of it is killed (its teardown comes
        after), or at once if there is nothing to end here."""
        if open_id not in self.sessions or self.process is None or self.process.returncode is not None:
            return closed_now()
        future: asyncio.Future[Closed] = asyncio.get_running_loop().create_future()
        self.sessions.discard(open_id)
        future.add_done_callback(lambda done: done.cancelled() or done.exception())  # a crash here is no one's error
        job_id = next_id()
        self.pending[job_id] = future  # type: ignore[assignment]  # a close is answered closed or failed
        self._write({"op": "close", "id": job_id, "session": open_id}, b"")
        return future

    def interrupt_session(self, open_id: int) -> None:
        if open_id in self.sessions:
            self.send({"op": "interrupt", "id": next_id(), "session": open_id})

    def send(self, head: Head) -> None:
        """A request that has no reply (cancel, interrupt)."""
        if self.process is not None and self.process.returncode is None:
            self._write(head, b"")

    def _write(self, head: Head, body: bytes) -> None:
        assert self.process is not None
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush, self.process)
        # Pieces, never joined here: a body of tens of MB is not copied in the event loop.
        self._outgoing += (json.dumps(head).encode() + b"\t", body, b"\n")

    def _flush(self, process: ChildProcess) -> None:
        pieces, self._outgoing = self._outgoing, []
        if process is self.process:  # a zygote gone meanwhile fails its requests itself
            process.stdin.writelines(pieces)

    async def stop(self) -> None:
        self._closed = True
        proc, self.process = self.process, None
        if proc is not None and proc.returncode is None:
            if not self.launcher.isolated:
                # No PID namespace ends the runs with the zygote: at the end of its requests it kills them itself.
                proc.stdin.close()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), SHUTDOWN_WAIT)
            proc.send_signal(signal.SIGKILL)  # bwrap is PID 1 of the sandbox: all of it goes
            await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._fail_all("the server is shutting down")


def _reply_of(line: bytes) -> Reply:
    """A zygote's reply line; a large one (a fetched file, a run's output) decoded a piece at a time,
    uncapped: the zygote caps what a reply carries."""
    reply: Reply = decode(line, sys.maxsize, sys.maxsize) if len(line) >= OFF_LOOP_BYTES else json.loads(line)
    return reply


async def encode_body(body: Union[RunBody, SessionCallBody]) -> bytes:
    """A body as one line of JSON (json.dumps escapes every newline and tab)."""
    return await off_loop(text_size(body), json_bytes, body)


def closed_now() -> Closing[Closed]:
    """What `close_session` answers where there is nothing left to kill."""
    future: asyncio.Future[Closed] = asyncio.get_running_loop().create_future()
    future.set_result({"kind": "closed", "id": 0})
    return future


async def closed(future: Closing[Closed], timeout: float = CLOSE_WAIT) -> None:
    """Wait for a close to have killed every process of its session (a crashed sandbox took them with
    it; past `timeout` the caller goes on without the answer)."""
    with contextlib.suppress(SandboxCrashed, asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(future), timeout)
