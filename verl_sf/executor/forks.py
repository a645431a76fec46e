"""Forks and snapshots of live sessions: copies made between calls (every copy or none), frozen
copies kept as snapshots until deleted or past their TTL, and sessions started from them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Optional, Union

from verl_sf.errors import ForkFailed, ForkUnavailable, InvalidRequest, SessionBusy, SessionGone
from verl_sf.executor import jobs
from verl_sf.executor.admission import Admission
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.rungs import LANDLOCK_SCOPED_SIGNALS_ABI, Rung, landlock_abi
from verl_sf.executor.session_table import SessionRecord
from verl_sf.executor.sessions import Sessions
from verl_sf.executor.snapshot_table import Snapshot, SnapshotTable
from verl_sf.executor.zygote.messages import FailedReply, ForkReply
from verl_sf.executor.zygote_process import Closed, Closing, SandboxCrashed, ZygoteProcess, closed_now
from verl_sf.models import SessionCreateRequest, SessionForkRequest, SessionForkResponse, SessionInfo, SnapshotInfo

# A fork's first call, when the request asks its random generators reseeded (they otherwise
# draw what the parent would have drawn next, as after fork(2)).
RESEED = {"python": "import random as _r, sys as _s\n_r.seed()\nif 'numpy' in _s.modules:\n"
                    "    _s.modules['numpy'].random.seed()\ndel _r, _s\n",
          "bash": "RANDOM=$SRANDOM"}
# Run in a python session just before it is forked: the collector then leaves the objects made so
# far alone, so the copies do not write (and so copy) every page of them on their first collection.
FREEZE = "import gc as _gc\n_gc.freeze()\ndel _gc\n"


def why_no_forks(rung: Rung) -> str:
    """Why a server on `rung` cannot fork sessions ("" if it can)."""
    if not rung.forks:
        return (f"forks and snapshots need the namespaces isolation rung; this server runs "
                f"{rung.name!r} ({rung.reason})")
    abi, needed = landlock_abi(), LANDLOCK_SCOPED_SIGNALS_ABI
    if abi < needed:
        return (f"forks and snapshots need Landlock ABI {needed} (Linux 6.12) to keep a live parent from "
                f"signalling its copies; this kernel has ABI {abi}")
    return ""


class Forks:
    def __init__(self, config: ExecutorConfig, admission: Admission, sessions: Sessions):
        self.config = config
        self._admission = admission
        self.snapshots = SnapshotTable(sessions.table.boot_tag)
        self.refusal = "the executor has not started"  # why sessions cannot be forked ("": they can)
        self._sessions = sessions

    def _check_forkable(self) -> None:
        if self.refusal:
            raise ForkUnavailable(self.refusal)

    async def fork_session(self, session_id: str, request: SessionForkRequest) -> SessionForkResponse:
        source = self._sessions.table.get(session_id)
        self._check_forkable()
        if request.count > self.config.max_sessions:
            raise InvalidRequest("count", f"count={request.count} is above the server's cap of "
                                          f"{self.config.max_sessions} sessions (--max-sessions)")
        self._sessions.reserve(request.count)
        copies = await self._fork_idle(source, request.count, freeze=False)
        sessions = [self._sessions.adopt(open_id, group, source.language, source.zygote, source.memory_mb,
                                         request.idle_ttl_s or source.idle_ttl_s) for open_id, group in copies]
        if request.reseed:
            await self._reseed(sessions)
        return SessionForkResponse(session_ids=[session.id for session in sessions])

    async def snapshot_session(self, session_id: str) -> SnapshotInfo:
        source = self._sessions.table.get(session_id)
        self._check_forkable()
        if len(self.snapshots) >= self.config.max_snapshots:
            raise self._admission.refuse(f"{len(self.snapshots)} snapshots kept (max_snapshots); delete one, or "
                                         f"wait for one to expire")
        [(open_id, _)] = await self._fork_idle(source, 1, freeze=True)
        snapshot = Snapshot(id=self.snapshots.new_id(), language=source.language,
                            zygote=source.zygote, open_id=open_id, memory_mb=source.memory_mb,
                            idle_ttl_s=source.idle_ttl_s, expires_at=time.time() + self.config.snapshot_ttl_s)
        self.snapshots.add(snapshot)
        return self.info(snapshot.id)

    async def _fork_idle(self, source: SessionRecord, count: int, freeze: bool) -> list[tuple[int, Optional[str]]]:
        """Copies of a session between calls (409 while one runs), its collector frozen first."""
        if source.busy.locked():
            raise SessionBusy(source.id, "another fork or snapshot of it is being made (one at a time)"
                              if source.forking else "a call is running in it (a fork never copies a half-run call)")
        source.forking = True
        try:
            if source.language == "python":
                await self._sessions.quiet_call(source, FREEZE)
            async with source.busy:
                return await self._fork(source.zygote, source.open_id, source.id, source.memory_mb, count, freeze,
                                        lambda: self._sessions.table.get(source.id))
        finally:
            source.forking = False

    def info(self, snapshot_id: str) -> SnapshotInfo:
        snapshot = self.snapshots.get(snapshot_id)
        return SnapshotInfo(snapshot_id=snapshot.id, language=snapshot.language, created_at=snapshot.created_at,
                            expires_at=snapshot.expires_at, sessions_started=snapshot.sessions_started,
                            memory_limit_MB=snapshot.memory_mb)

    def drop(self, snapshot: Snapshot, reason: str) -> Closing[Closed]:
        """Drop a snapshot; the future is done once every process of it is killed."""
        if self.snapshots.forget(snapshot, reason):
            return snapshot.zygote.close_session(snapshot.open_id)
        return closed_now()

    def died(self, open_id: int, reason: str) -> None:
        snapshot = self.snapshots.by_open_id(open_id)
        if snapshot is not None:
            self.snapshots.forget(snapshot, reason)

    def expire(self, now: float) -> None:
        for snapshot in self.snapshots.expired(now):
            self.drop(snapshot, f"expired: kept for its TTL of {self.config.snapshot_ttl_s:g} s")

    async def start_from(self, request: SessionCreateRequest) -> SessionInfo:
        assert request.from_snapshot is not None
        snapshot = self.snapshots.get(request.from_snapshot)
        if request.language != snapshot.language and "language" in request.model_fields_set:
            raise InvalidRequest("language", f"snapshot {snapshot.id!r} runs {snapshot.language}, not "
                                             f"{request.language}: a session started from it takes its language")
        if request.files:
            raise InvalidRequest("files", "a session started from a snapshot holds the snapshot's files; "
                                          "write more with code")
        self._check_forkable()
        self._sessions.reserve(1)
        memory_mb = (snapshot.memory_mb if request.memory_limit_MB == -1
                     else self.config.memory_mb(request.memory_limit_MB))
        async with snapshot.starting:  # a group's trajectories start together: they queue, never 409
            [(open_id, group)] = await self._fork(snapshot.zygote, snapshot.open_id, snapshot.id, memory_mb, 1,
                                                  False, lambda: self.snapshots.get(snapshot.id))
        snapshot.sessions_started += 1
        session = self._sessions.adopt(open_id, group, snapshot.language, snapshot.zygote, memory_mb,
                                       request.idle_ttl_s or snapshot.idle_ttl_s)
        return self._sessions.info(session.id)

    async def _fork(self, zygote: ZygoteProcess, open_id: int, name: str, memory_mb: int, count: int,
                    freeze: bool, still_there: Callable[[], object]) -> list[tuple[int, Optional[str]]]:
        """The copies' open ids and cgroups; every copy or none.  `still_there` raises the source's
        Gone error (with why) once the server has ended it: a fork that lost a race with its end says so."""
        cap = self.config.runs_memory_mb << 20
        head = jobs.session_fork(open_id, count, self.config, memory_mb, freeze,
                                 max(0, cap - (self._admission.memory_used() or 0)))
        table = self._sessions.table
        table.opening += count
        try:
            forking = asyncio.ensure_future(zygote.fork_session(head))
            try:
                reply = await asyncio.shield(forking)
            except asyncio.CancelledError:  # its client left: the copies are made all the same, and closed
                def close_copies(done: asyncio.Future[Union[ForkReply, FailedReply]]) -> None:
                    forked = done.result()
                    for copy in forked.get("sessions", []) if forked["kind"] == "fork" else []:
                        zygote.close_session(copy["id"])
                forking.add_done_callback(close_copies)
                raise
        except SandboxCrashed as exc:
            raise SessionGone(name, f"its sandbox crashed: {exc}") from exc
        finally:
            table.opening -= count
        if reply["kind"] == "failed" or reply["status"] != "Finished":
            still_there()
        if reply["kind"] == "failed":
            raise ForkFailed(f"{name!r} could not be forked: {reply['error']}")
        if reply["status"] != "Finished":
            error = reply.get("error", "the sandbox gave no reason")
            if reply.get("busy"):
                raise SessionBusy(name, error)
            if reply.get("limit"):  # capacity: the copies' processes or files do not fit now
                raise self._admission.refuse(f"{name!r} could not be forked: {error}")
            if not reply["session_alive"]:
                raise SessionGone(name, error)
            raise ForkFailed(f"{name!r} could not be forked: {error}")
        return [(copy["id"], copy["group"]) for copy in reply.get("sessions", [])]

    async def _reseed(self, sessions: list[SessionRecord]) -> None:
        for session in sessions:
            reply = await self._sessions.quiet_call(session, RESEED[session.language])
            if reply["kind"] == "failed" or reply.get("return_code") != 0:
                for copy in sessions:
                    self._sessions.end_record(copy, "its random generators could not be reseeded")
                why = reply["error"] if reply["kind"] == "failed" else reply.get("stderr", "")
                raise ForkFailed(f"reseeding a fork failed: {why[-500:]}")
