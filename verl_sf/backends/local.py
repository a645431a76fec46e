"""`backend: local`: our executor inside the calling process, no server to start.

For one-box users and tests: the same isolation and runners as `verl-sf serve`, minus the
HTTP hop, sessions included (the executor's live interpreters, their forks and snapshots).  The executor (its warm
sandbox slots) is started on first use, not at construction, so building a tool or a pool
that never runs code costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import ClassVar, Literal, Optional, TypeVar

from pydantic import Field, field_validator

from verl_sf.backends.base import BackendConfigBase, SandboxUnavailable
from verl_sf.backends.sessions import ServerSessionBackend
from verl_sf.errors import SessionGone, SnapshotGone
from verl_sf.executor import Executor, ExecutorConfig, IsolationUnavailable, Overloaded, closed
from verl_sf.executor.config import CONFIG_ALIASES
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreateRequest,
    SessionForkRequest,
    SessionInfo,
    SnapshotInfo,
)

ResponseT = TypeVar("ResponseT")


class LocalBackendConfig(BackendConfigBase):
    """`backend: local`: the executor inside the calling process; the yaml's `local:` block is its settings."""

    type: Literal["local"] = "local"
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    tool_block_field: ClassVar[Optional[str]] = "executor"

    @field_validator("executor", mode="before")
    @classmethod
    def _earlier_names(cls, value: object) -> object:
        """`workers` and `max_queue` are the earlier names of `slots` and `max_in_flight`."""
        if isinstance(value, dict):
            return {CONFIG_ALIASES.get(key, key): item for key, item in value.items()}
        return value

    def build(self) -> LocalSandboxBackend:
        return LocalSandboxBackend(self)


class LocalSandboxBackend(ServerSessionBackend):
    """Runs requests on an in-process `Executor`, started lazily and at most once."""

    name = "local"

    def __init__(self, config: Optional[LocalBackendConfig] = None):
        super().__init__()
        self.config = config or LocalBackendConfig()
        self._executor: Optional[Executor] = None
        self._start_lock = asyncio.Lock()

    async def _ready(self) -> Executor:
        if self._executor is not None:
            return self._executor
        async with self._start_lock:
            if self._executor is None:
                executor = Executor(self.config.executor)
                try:
                    await executor.start()
                except IsolationUnavailable as exc:
                    await executor.close()
                    raise SandboxUnavailable(f"local executor cannot isolate runs: {exc}") from exc
                self._executor = executor
        return self._executor

    async def _run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        executor = await self._ready()
        return await _unless_overloaded(executor.run_code(request))

    async def _create_session(self, request: SessionCreateRequest) -> SessionInfo:
        executor = await self._ready()
        return await _unless_overloaded(executor.create_session(request))

    async def _delete_session(self, session_id: str) -> None:
        if self._executor is None:
            return
        with contextlib.suppress(SessionGone):  # already gone, which is what was asked
            await closed(self._executor.end_session(session_id))

    async def _fork_session(self, session_id: str, request: SessionForkRequest) -> list[str]:
        executor = await self._ready()
        forks = await _unless_overloaded(executor.fork_session(session_id, request))
        return forks.session_ids

    async def _snapshot_session(self, session_id: str) -> SnapshotInfo:
        executor = await self._ready()
        return await _unless_overloaded(executor.snapshot_session(session_id))

    async def _delete_snapshot(self, snapshot_id: str) -> None:
        if self._executor is None:
            return
        with contextlib.suppress(SnapshotGone):  # already gone, which is what was asked
            await closed(self._executor.delete_snapshot(snapshot_id))

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        executor = await self._ready()
        return await _unless_overloaded(executor.run_jupyter(request))

    async def close(self) -> None:
        """Stop the executor, which ends every session it holds."""
        self._session_ids.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            await executor.close()


async def _unless_overloaded(call: Awaitable[ResponseT]) -> ResponseT:
    """A full executor queue is the in-process twin of HTTP 503: the sandbox gave no answer."""
    try:
        return await call
    except Overloaded as exc:
        raise SandboxUnavailable(f"local executor overloaded: {exc}") from exc
