"""The one interface every backend (http, local, daytona, cluster) implements, and the base of their configs.

The tool and the pool talk only to this, so a user switches backends with a config key
and the rest of the stack does not notice.  Each backend module holds its backend and its
config (a `BackendConfigBase` whose `build()` makes the backend); `verl_sf.backends.config`
is their union, told apart by `type`.  Sessions are part of the interface: a call names a
session by the caller's key, a session that is gone raises `verl_sf.errors.SessionGone`.
Forks and snapshots of a session are too, on the backends whose sessions are a verl-sf
server's (the others raise `verl_sf.errors.ForkUnavailable`).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable
from typing import Any, ClassVar, Optional, TypeVar

from pydantic import BaseModel, ConfigDict

from verl_sf.errors import ForkUnavailable, VerlSfError
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionLanguage,
    SnapshotInfo,
)

T = TypeVar("T")


async def created_or_none(creation: Optional[Awaitable[T]]) -> Optional[T]:
    """What a session's creation made, or None when there was none or it failed (nothing to release)."""
    if creation is None:
        return None
    try:
        return await creation
    except Exception:
        return None


class SandboxUnavailable(VerlSfError, RuntimeError):
    """The sandbox could not be reached or gave no usable answer (after any retries).

    Distinct from a run that reached the sandbox and failed on its own terms, which is a
    normal `RunCodeResponse` with status Failed or SandboxError.
    """


class SessionsUnsupported(VerlSfError, RuntimeError):
    """Sessions were asked for, but the sandbox server keeps none (e.g. a plain Sandbox Fusion server)."""


class SandboxBackend(abc.ABC):
    """Runs one request and returns the Sandbox Fusion response.

    Implementations must be cheap to call repeatedly (verl calls create/execute/release
    around every single tool call) and safe to share between coroutines of one loop.
    """

    name: ClassVar[str] = "abstract"
    supports_sessions: ClassVar[bool] = False
    """True when calls that name one `session` share state (files, installed packages,
    variables) until `end_session`; False: every call starts fresh and `session` is ignored."""

    async def check_sessions(self) -> None:
        """Raise `SessionsUnsupported` when this backend's sandbox cannot keep sessions after all."""
        if not self.supports_sessions:
            raise SessionsUnsupported(f"backend {self.name!r} does not keep sessions")

    @abc.abstractmethod
    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        """Run `request` (in `session`, if the backend keeps sessions); raise SandboxUnavailable
        when no answer could be had, `SessionGone` when the session's state is gone."""

    async def end_session(self, session: str) -> None:  # noqa: B027 (a no-op default: most backends hold nothing)
        """Release what `session` holds (a sandbox, a process).  Idempotent; a no-op without sessions."""

    async def open_session(self, session: str, language: SessionLanguage = "python", *,
                           from_snapshot: Optional[str] = None) -> str:
        """Open `session`'s server session now, from snapshot `from_snapshot`'s state when given (whose
        language `language` must be), instead of at its first call; a key already open keeps its session.
        Returns the server's session id; `SnapshotGone` when the snapshot is."""
        raise ForkUnavailable(f"backend {self.name!r} cannot open sessions from snapshots")

    async def fork_session(self, session: str, count: int = 1, *, language: SessionLanguage = "python",
                           reseed: bool = False, idle_ttl_s: Optional[float] = None) -> list[str]:
        """`count` new sessions holding `session`'s live state; their keys, usable as `session=` at once.
        `SessionGone` when it is, `SessionBusy` while it runs a call."""
        raise ForkUnavailable(f"backend {self.name!r} cannot fork sessions")

    async def snapshot_session(self, session: str, *, language: SessionLanguage = "python") -> SnapshotInfo:
        """A frozen copy of `session`'s live state, which `open_session(from_snapshot=...)` starts sessions from."""
        raise ForkUnavailable(f"backend {self.name!r} cannot snapshot sessions")

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot this backend's server holds.  Idempotent: one already gone is not an error."""
        raise ForkUnavailable(f"backend {self.name!r} keeps no snapshots")

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        raise NotImplementedError(f"backend {self.name!r} does not support run_jupyter")

    async def close(self) -> None:  # noqa: B027 (a no-op default: most backends hold nothing)
        """Release connections, sandboxes, processes.  Idempotent."""


class BackendConfigBase(BaseModel):
    """Base of the per-backend configs: plain, frozen data, tagged by `type`, that builds its backend.

    A config is what the tool hands to whichever process runs the call (its own, or a Ray pool
    actor); that process keeps one backend per config (`build()` once, keyed on `key()`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_block_field: ClassVar[Optional[str]] = None
    """The field the tool yaml's `<type>:` block fills; None: the block holds this config's own fields."""
    default_session: ClassVar[str] = "none"
    """The verl tool's `session` when its yaml sets none: `none` (stateless) or `trajectory`."""

    type: str

    @abc.abstractmethod
    def build(self) -> SandboxBackend:
        """A new backend; it connects and starts nothing until its first call."""

    def key(self) -> str:
        """Equal for equal configs, whatever their fields hold (dicts, nested models): the canonical JSON."""
        return self.model_dump_json()

    def probe_sessions(self) -> bool:
        """Blocking, for construction time: True when sessions are known to work, False when that cannot be
        told yet (ask the backend's `check_sessions()` later); raises `SessionsUnsupported` when they cannot."""
        return True

    @classmethod
    def from_tool_block(cls, block: dict[str, Any], *, sandbox_fusion_url: Optional[str]) -> dict[str, Any]:
        """The raw config a tool yaml's flat keys and `<type>:` block describe (validated by the caller)."""
        name = cls.model_fields["type"].default
        return {"type": name, **(block if cls.tool_block_field is None else {cls.tool_block_field: block})}
