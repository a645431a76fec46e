"""The one interface every backend (http, local, daytona) implements.

The tool and the pool talk only to this, so a user switches backends with a config key
and the rest of the stack does not notice.  Each backend is built from its config in
`verl_sf.backends.config` (`config.build()`), which says how to add one.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable
from typing import ClassVar, Optional, TypeVar

from verl_sf.errors import VerlSfError
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse

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


class SessionEnded(VerlSfError, LookupError):
    """The server no longer has the session a call named (ended, expired, evicted, killed, restarted).

    Its state is gone; `reason` is the server's word on why.  The next call with the same
    session key starts a fresh session: never silently, since this error reached the caller first.
    """

    def __init__(self, session: str, reason: str):
        super().__init__(f"session {session!r} has ended: {reason}")
        self.session = session
        self.reason = reason


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
        when no answer could be had."""

    async def end_session(self, session: str) -> None:  # noqa: B027 (a no-op default: most backends hold nothing)
        """Release what `session` holds (a sandbox, a process).  Idempotent; a no-op without sessions."""

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        raise NotImplementedError(f"backend {self.name!r} does not support run_jupyter")

    async def close(self) -> None:  # noqa: B027 (a no-op default: most backends hold nothing)
        """Release connections, sandboxes, processes.  Idempotent."""
