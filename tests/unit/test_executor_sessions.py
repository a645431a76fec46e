"""Sessions in the real executor (in this process, real sandboxes): what admission does to them."""

from __future__ import annotations

import asyncio

import pytest

from verl_sf.executor import Executor, ExecutorConfig, Overloaded
from verl_sf.models import RunCodeRequest, RunStatus, SessionCreateRequest


async def test_a_session_call_refused_for_overload_leaves_the_session_usable() -> None:
    async with Executor(ExecutorConfig(slots=1, max_in_flight=1, sandboxes=1, preload=())) as executor:
        session = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
        call = RunCodeRequest(code="x = 41", language="python", session_id=session)
        assert (await executor.run_code(call)).status == RunStatus.Success
        slow = asyncio.ensure_future(executor.run_code(RunCodeRequest(code="import time; time.sleep(1)",
                                                                      language="python")))
        while executor.stats.in_flight == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):
            await executor.run_code(call.model_copy(update={"code": "x += 1"}))
        assert (await slow).status == RunStatus.Success
        # The refused call held the session's turn; a later call must get it (not wait forever).
        after = await asyncio.wait_for(executor.run_code(call.model_copy(update={"code": "print(x + 1)"})), 60)
        assert after.status == RunStatus.Success and after.run_result and after.run_result.stdout == "42\n"
        assert session in executor.sessions
