"""Backend sessions on a verl-sf server's live interpreters (`POST /sessions`), for http, local and cluster.

A caller names a session by its own key (the verl tool: one per trajectory).  The first call
with a key creates the server session (one per key and language: a python and a bash session
are separate sandboxes); later calls run in it with `session_id`.  Languages without sessions
(anything but python and bash) run stateless.  When the server says the session is gone (ended,
expired, evicted, restarted, its server died) the caller gets `SessionGone` and the key is
forgotten, so its next call starts a fresh session (a caller that names a server `session_id`
itself gets the same `SessionGone`); a call whose reply says it ended the session (killed at its
time-out or for memory) already told the caller, so the key is forgotten silently.

A key's session may also be opened from a snapshot (`open_session(key, from_snapshot=id)`) before
its first call, forked into new keys (`fork_session`), or frozen into a snapshot (`snapshot_session`).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Optional
from uuid import uuid4

from verl_sf.backends.base import SandboxBackend, created_or_none
from verl_sf.errors import InvalidRequest, SessionGone
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    SessionCreateRequest,
    SessionForkRequest,
    SessionInfo,
    SessionLanguage,
    SnapshotInfo,
)

SESSION_LANGUAGES = ("python", "bash")
SessionKey = tuple[str, str]  # (the caller's session key, language)


class ServerSessionBackend(SandboxBackend):
    """A backend whose sessions are a verl-sf executor's; subclasses say how to reach it."""

    supports_sessions = True

    def __init__(self) -> None:
        self._session_ids: dict[SessionKey, asyncio.Future[str]] = {}

    def __getstate__(self) -> dict:
        """A copy in another process starts with no sessions: they belong to this process's event loop."""
        return {**self.__dict__, "_session_ids": {}}

    # ---- what a subclass provides ---------------------------------------------------------
    @abc.abstractmethod
    async def _run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        """Run one request (with or without `session_id`) as the server answers it; `SessionGone` when the
        server no longer has the session it names."""

    @abc.abstractmethod
    async def _create_session(self, request: SessionCreateRequest) -> SessionInfo:
        """Create a server session (`SnapshotGone` when its `from_snapshot` is)."""

    @abc.abstractmethod
    async def _delete_session(self, session_id: str) -> None:
        """End a server session; one already gone is not an error."""

    @abc.abstractmethod
    async def _fork_session(self, session_id: str, request: SessionForkRequest) -> list[str]:
        """Fork a server session; the forks' server ids."""

    @abc.abstractmethod
    async def _snapshot_session(self, session_id: str) -> SnapshotInfo:
        """Snapshot a server session."""

    @abc.abstractmethod
    async def _delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot; one already gone is not an error."""

    # ---- the interface --------------------------------------------------------------------
    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        if session is None or request.language not in SESSION_LANGUAGES:
            return await self._run_code(request)
        key = (session, request.language)
        created = key not in self._session_ids
        session_id = await self._session_id(key, lambda: SessionCreateRequest(
            language=request.language, memory_limit_MB=request.memory_limit_MB, files=dict(request.files)))
        call = request.model_copy(update={"session_id": session_id, "files": {} if created else request.files})
        try:
            response = await self._run_code(call)
        except SessionGone:
            self._forget(key, session_id)
            raise
        if response.session_alive is False:
            self._forget(key, session_id)
        return response

    async def open_session(self, session: str, language: SessionLanguage = "python", *,
                           from_snapshot: Optional[str] = None) -> str:
        # A session started from a snapshot takes the snapshot's language: the request may not name one.
        create = SessionCreateRequest(from_snapshot=from_snapshot) if from_snapshot \
            else SessionCreateRequest(language=language)
        return await self._session_id((session, language), lambda: create)

    async def fork_session(self, session: str, count: int = 1, *, language: SessionLanguage = "python",
                           reseed: bool = False, idle_ttl_s: Optional[float] = None) -> list[str]:
        key = (session, language)
        parent = await self._open_id(key)
        request = SessionForkRequest(count=count, reseed=reseed, idle_ttl_s=idle_ttl_s)
        try:
            forks = await self._fork_session(parent, request)
        except SessionGone:
            self._forget(key, parent)
            raise
        keys = [f"{session}.fork-{uuid4().hex[:12]}" for _ in forks]
        loop = asyncio.get_running_loop()
        for fork_key, fork_id in zip(keys, forks, strict=True):
            future: asyncio.Future[str] = loop.create_future()
            future.set_result(fork_id)
            self._session_ids[(fork_key, language)] = future
        return keys

    async def snapshot_session(self, session: str, *, language: SessionLanguage = "python") -> SnapshotInfo:
        key = (session, language)
        session_id = await self._open_id(key)
        try:
            return await self._snapshot_session(session_id)
        except SessionGone:
            self._forget(key, session_id)
            raise

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._delete_snapshot(snapshot_id)

    async def end_session(self, session: str) -> None:
        """End the server sessions `session` holds (python, bash).  Idempotent."""
        for language in SESSION_LANGUAGES:
            session_id = await created_or_none(self._session_ids.pop((session, language), None))
            if session_id is not None:
                await self._delete_session(session_id)

    def sessions(self) -> list[str]:
        """The caller keys that hold a live (or starting) session."""
        return sorted({key for key, _ in self._session_ids})

    async def _end_all_sessions(self) -> None:
        await asyncio.gather(*(self.end_session(key) for key in self.sessions()), return_exceptions=True)

    # ---- internals ------------------------------------------------------------------------
    async def _session_id(self, key: SessionKey, create: Callable[[], SessionCreateRequest]) -> str:
        """The key's server session, created once even when its first calls race."""
        future = self._session_ids.get(key)
        if future is None:
            future = self._session_ids[key] = asyncio.ensure_future(self._new_session(create(), key[1]))
        try:
            return await asyncio.shield(future)
        except Exception:
            if self._session_ids.get(key) is future:
                del self._session_ids[key]
            raise

    async def _new_session(self, request: SessionCreateRequest, language: str) -> str:
        """A new server session's id, in the key's language (a snapshot's session is in the snapshot's)."""
        info = await self._create_session(request)
        if info.language != language:
            await self._delete_session(info.session_id)
            raise InvalidRequest("language", f"snapshot {request.from_snapshot!r} holds a {info.language} session, "
                                             f"not a {language} one")
        return info.session_id

    async def _open_id(self, key: SessionKey) -> str:
        """The server id of a key's session, which must be open already (a fork or a snapshot of nothing is a bug)."""
        future = self._session_ids.get(key)
        if future is None:
            raise SessionGone(key[0], f"no {key[1]} session is open under this key")
        return await asyncio.shield(future)

    def _forget(self, key: SessionKey, session_id: str) -> None:
        future = self._session_ids.get(key)
        if future is not None and future.done() and not future.cancelled() and future.exception() is None \
                and future.result() == session_id:
            del self._session_ids[key]
