"""The executor's session API as the session mode uses it: open, run in, close.

Kept to this one class so the names of the executor's session calls live in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

from verl_sf import executor as executor_api
from verl_sf import models
from verl_sf.errors import SessionGone


@dataclasses.dataclass(frozen=True)
class SessionCall:
    response: models.RunCodeResponse
    ended: Optional[str] = None
    """Why the session ended during this call (killed at its time-out, for memory, by exit); None if it lives."""


class ExecutorSessions:
    def __init__(self, executor: executor_api.Executor, idle_ttl_s: float, setup: Optional[models.RunCodeRequest]):
        self.executor = executor
        self.idle_ttl_s = idle_ttl_s
        self.setup = setup
        """Run in every new session before its first turn: a call of its own, so turns keep their line numbers."""

    async def open(self) -> str:
        request = models.SessionCreateRequest(language="python", idle_ttl_s=self.idle_ttl_s)
        session_id = (await self.executor.create_session(request)).session_id
        if self.setup is None:
            return session_id
        try:
            call = await self.run(session_id, self.setup)
        except BaseException:
            self.close(session_id)
            raise
        if call.ended is not None or call.response.status != models.RunStatus.Success:
            self.close(session_id)
            raise RuntimeError(f"a new session's set-up failed: {call.response.message or call.ended}")
        return session_id

    async def run(self, session_id: str, request: models.RunCodeRequest) -> SessionCall:
        response = await self.executor.run_code(request.model_copy(update={"session_id": session_id}))
        try:
            self.executor.session_info(session_id)
        except SessionGone as exc:
            return SessionCall(response, exc.reason)
        return SessionCall(response)

    def close(self, session_id: str) -> None:
        with contextlib.suppress(SessionGone):  # already gone: ending it was the point
            self.executor.end_session(session_id)
