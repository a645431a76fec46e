"""The executor's live sessions: opened in a zygote, called one call at a time, ended, expired
after their idle TTL or lifetime, and evicted, longest idle first, for a new session or run that
needs their place or their memory."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Optional, Union

from verl_sf.errors import InvalidRequest, Overloaded, SandboxFailure, SessionGone
from verl_sf.executor import jobs
from verl_sf.executor.admission import Admission
from verl_sf.executor.config import CELLS, ExecutorConfig
from verl_sf.executor.pool import STDLIB, ZygotePool
from verl_sf.executor.responses import FAILED_CALL, ResponseContext, jupyter_response, note_session_end, run_response
from verl_sf.executor.session_table import SessionRecord, SessionTable
from verl_sf.executor.status import ExecutorStats
from verl_sf.executor.zygote.messages import CallReply, FailedReply, SessionCallBody, SessionCallHead
from verl_sf.executor.zygote_process import Closed, Closing, SandboxCrashed, ZygoteProcess, encode_body
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreateRequest,
    SessionInfo,
)

Called = Union[CallReply, FailedReply]


class Sessions:
    def __init__(self, config: ExecutorConfig, stats: ExecutorStats, admission: Admission):
        self.config = config
        self.stats = stats
        self.table = SessionTable()
        self._admission = admission
        self.pool: Optional[ZygotePool] = None  # set at start

    async def create(self, request: SessionCreateRequest, cells: bool, rooted: bool) -> SessionInfo:
        """`cells`: forked from a zygote whose IPython shell is built already.  `rooted`: its commands
        may run as root (the caller has checked that the rung offers it)."""
        assert self.pool is not None, "Executor.start() first"
        if len(self.table) + self.table.opening >= self.config.max_sessions:
            idle = self.table.idle()  # a session in a call is not idle
            if not idle:
                raise self._admission.refuse(f"{len(self.table)} live sessions (max_sessions), all running a call")
            self.end_record(idle[0], f"evicted: the server's cap of {self.config.max_sessions} live sessions was "
                                     f"reached and it was the longest idle")
        memory_mb = self.config.memory_mb(request.memory_limit_MB)
        zygote = await self.pool.pick(STDLIB + CELLS if cells else STDLIB)
        head, body = jobs.session_open(request.language, request.files, self.config, memory_mb, rooted)
        session = SessionRecord(id=self.table.new_id(), language=request.language, zygote=zygote, open_id=head["id"],
                                memory_mb=memory_mb, idle_ttl_s=request.idle_ttl_s or self.config.session_idle_ttl_s)
        opening = asyncio.ensure_future(zygote.open_session(head, body))
        self.table.opening += 1
        try:
            reply = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # Its client left: the session is opened all the same and closed at once, never left unrecorded.
            opening.add_done_callback(lambda _: zygote.close_session(head["id"]))
            raise
        finally:
            self.table.opening -= 1
        if reply["kind"] == "failed" or not reply["session_alive"]:
            why = reply["error"] if reply["kind"] == "failed" else reply.get("session_end", "its interpreter exited")
            if reply["kind"] == "session" and reply.get("limit"):
                raise self._admission.refuse(f"the session could not start: {why}")
            if request.files:  # what the request gave may be why; else the sandbox is (a limit it reached)
                raise InvalidRequest("files", f"the session could not start: {why}")
            raise SandboxFailure(f"the session could not start: {why}")
        session.group = reply.get("group")
        self.table.add(session)
        self.stats.sessions_created += 1
        return self.info(session.id)

    def adopt(self, open_id: int, group: Optional[str], language: str, zygote: ZygoteProcess, memory_mb: int,
              idle_ttl_s: float) -> SessionRecord:
        """Record a session the zygote made as a copy of another."""
        session = SessionRecord(id=self.table.new_id(), language=language, zygote=zygote, open_id=open_id,
                                memory_mb=memory_mb, idle_ttl_s=idle_ttl_s, group=group)
        self.table.add(session)
        self.stats.sessions_created += 1
        return session

    def reserve(self, count: int) -> None:
        """Room for `count` more sessions, under the session cap and the memory cap, or 503."""
        live = len(self.table) + self.table.opening
        if live + count > self.config.max_sessions:
            raise self._admission.refuse(f"{live} live sessions and {count} more asked for: past max_sessions="
                                         f"{self.config.max_sessions}")
        self._admission.reserve_memory()

    def info(self, session_id: str) -> SessionInfo:
        session = self.table.get(session_id)
        return SessionInfo(session_id=session.id, language=session.language, alive=True,
                           created_at=session.created_at, idle_since=session.idle_since, idle_ttl_s=session.idle_ttl_s,
                           calls=session.calls, memory_bytes=self._memory(session),
                           memory_limit_MB=session.memory_mb, executor_pod_name=self.config.pod_name)

    @staticmethod
    def _memory(session: SessionRecord) -> Optional[int]:
        cgroup = session.zygote.cgroup
        if cgroup is None or session.group is None or "memory" not in cgroup.dirs:
            return None
        name = "memory.current" if cgroup.v2 else "memory.usage_in_bytes"
        try:
            with open(os.path.join(cgroup.dirs["memory"], session.group, name)) as fh:
                return int(fh.read())
        except (OSError, ValueError):
            return None

    def make_room(self, memory_mb: int) -> None:
        """Idle sessions' files count against the cap over all runs and sessions but belong to no
        running process, so the kernel would kill a new run for them: when the cap is near, the
        longest-idle sessions are evicted first (a run is assumed to need at most a quarter of the
        cap).  Without sessions nothing is read: the hot path of stateless runs."""
        if not self.table.live:
            return
        used = self._admission.memory_used()
        cap = self.config.runs_memory_mb << 20
        need = min(memory_mb << 20, cap // 4)
        if used is None or used + need <= cap:
            return
        free = cap - used
        idle = [(session, self._memory(session) or 0) for session in self.table.idle()]
        if free + sum(held for _, held in idle) < need:
            return  # evicting every idle session would not make the room: none is ended for nothing
        for session, held in idle:
            if need <= free:
                return
            self.end_record(session, f"evicted: its memory ({held >> 20} MB) was needed by a new run under the "
                                     f"server's cap of {self.config.runs_memory_mb} MB for all runs and sessions")
            free += held

    def end_record(self, session: SessionRecord, reason: str) -> Closing[Closed]:
        """End a session; the future is done once every process of it is killed."""
        self.table.forget(session, reason)
        return session.zygote.close_session(session.open_id)

    def interrupt(self, session_id: str) -> None:
        session = self.table.get(session_id)
        session.zygote.interrupt_session(session.open_id)

    def died(self, open_id: int, reason: str) -> None:
        session = self.table.by_open_id(open_id)
        if session is not None and self.table.forget(session, reason):
            self.stats.sessions_killed += 1

    def expire(self, now: float) -> None:
        for session, reason in self.table.expired(now, self.config.session_max_lifetime_s):
            self.stats.sessions_expired += 1
            self.end_record(session, reason)

    async def call(self, session: SessionRecord, timeout: float, body: SessionCallBody) -> tuple[Called, float]:
        """One call in the session, admitted as a run; (reply, time spent queued)."""
        arrived = time.monotonic()
        head: SessionCallHead = jobs.session_call(session.open_id, timeout, self.config, session.memory_mb)
        await session.busy.acquire()
        try:
            self.table.get(session.id)  # it may have ended while this call waited its turn: 404, and why
            self._admission.admit(session.memory_mb)  # its own session is busy: never evicted for it
        except (SessionGone, Overloaded):
            session.busy.release()  # refused: the session's next call must not wait for this one
            raise
        call = None
        try:
            lease = await self._admission.slots.acquire()
            queue_wait = time.monotonic() - arrived
            jobs.hand_over(head["limits"], queue_wait)
            try:
                call = asyncio.ensure_future(session.zygote.call(head, await encode_body(body)))
                reply = await asyncio.shield(call)
            finally:
                lease.release()
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            # The call goes on to its time-out: the session stays busy till then.
            if call is not None and not call.done():
                busy = session.busy
                call.add_done_callback(lambda _: busy.release())
                raise
            session.busy.release()
            raise
        except SandboxCrashed as exc:
            session.busy.release()
            # The server's own end of it (a shutdown forgets every session first) says why in its words.
            raise SessionGone(session.id, self.table.ended(session.id) or f"its sandbox crashed: {exc}") from exc
        finally:
            self.stats.in_flight -= 1
        session.busy.release()
        session.calls += 1
        session.idle_since = time.time()
        if reply["kind"] == "failed":  # its state is not known: it goes
            self.end_record(session, FAILED_CALL)
        elif not reply["session_alive"]:
            ended = self.table.ended(session.id)  # the server ended it (DELETE, eviction): its words, not the zygote's
            if ended is not None and reply["status"] == "Error":
                raise SessionGone(session.id, ended)  # the call reached it after its end: it never ran
            if ended is not None:
                reply["session_end"] = ended
            self.died(session.open_id, reply.get("session_end", "its interpreter exited"))
        return reply, queue_wait

    async def quiet_call(self, session: SessionRecord, code: str) -> Called:
        """A call of the server's own in a session (not counted among its calls)."""
        calls = session.calls
        reply, _ = await self.call(session, 10.0, {"code": code, "output_limit": 4096})
        session.calls = calls
        return reply

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert request.session_id is not None
        session = self.table.get(request.session_id)
        if request.language != session.language:
            raise InvalidRequest("language", f"session {session.id!r} runs {session.language}, not {request.language}")
        _refuse_files(request)
        if session.language == "bash":
            if "\x00" in request.code:
                raise InvalidRequest("code", "bash code cannot contain NUL characters")
            if request.stdin:
                raise InvalidRequest("stdin", "a bash session takes no stdin (its commands read from /dev/null); "
                                              "use a python session, or write the input to a file")
        reply, queue_wait = await self.call(session, request.run_timeout, jobs.code_call(request, self.config))
        context = ResponseContext.of(self.config, session.memory_mb, queue_wait, session.id)
        response = run_response(reply, False, context)
        self.stats.count(response)
        return note_session_end(response, reply)

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        assert request.session_id is not None
        session = self.table.get(request.session_id)
        if session.language != "python":
            raise InvalidRequest("session_id", f"session {session.id!r} runs {session.language}: cells need python")
        _refuse_files(request)
        reply, queue_wait = await self.call(session, request.total_timeout, jobs.cells_call(request, self.config))
        response = jupyter_response(reply, len(request.cells), request.total_timeout,
                                    ResponseContext.of(self.config, session.memory_mb, queue_wait, session.id))
        self.stats.count(response)
        return note_session_end(response, reply)


def _refuse_files(request: Union[RunCodeRequest, RunJupyterRequest]) -> None:
    """A session's files come with it (POST /sessions); a call that names some would run without them."""
    if request.files:
        raise InvalidRequest("files", "files are given when a session is created (POST /sessions); "
                                      "later calls write them with code")
