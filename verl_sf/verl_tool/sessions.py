"""The executor's session API as the session mode uses it: open, run in, close.

Kept to this one class so the names of the executor's session calls live in one place.
"""

from __future__ import annotations

import contextlib

from verl_sf import executor as executor_api
from verl_sf import models
from verl_sf.verl_tool.state import SessionGone


class ExecutorSessions:
    def __init__(self, executor: executor_api.Executor, idle_ttl_s: float):
        self.executor = executor
        self.idle_ttl_s = idle_ttl_s

    async def open(self) -> str:
        request = models.SessionCreateRequest(language="python", idle_ttl_s=self.idle_ttl_s)
        info = await self.executor.create_session(request)
        return info.session_id

    async def run(self, session_id: str, request: models.RunCodeRequest) -> models.RunCodeResponse:
        try:
            return await self.executor.run_code(request.model_copy(update={"session_id": session_id}))
        except executor_api.SessionNotFound as exc:
            raise SessionGone(exc.reason) from exc

    async def close(self, session_id: str) -> None:
        with contextlib.suppress(executor_api.SessionNotFound):  # already gone: ending it was the point
            self.executor.end_session(session_id)
