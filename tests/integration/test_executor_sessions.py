"""Sessions in the real executor (in this process, real sandboxes): what admission does to them."""

from __future__ import annotations

import asyncio
import resource

import pytest

from tests.waiting import wait_until_async
from verl_sf.executor import Executor, ExecutorConfig, Overloaded
from verl_sf.models import RunCodeRequest, RunStatus, SessionCreateRequest


async def test_a_session_call_refused_for_overload_leaves_the_session_usable() -> None:
    async with Executor(ExecutorConfig(slots=1, max_in_flight=1, sandboxes=1, preload=())) as executor:
        session = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
        call = RunCodeRequest(code="x = 41", language="python", session_id=session)
        assert (await executor.run_code(call)).status == RunStatus.Success
        slow = asyncio.ensure_future(executor.run_code(RunCodeRequest(code="import time; time.sleep(1)",
                                                                      language="python")))
        await wait_until_async(lambda: executor.stats.in_flight > 0, 60, "the slow run is in flight", every=0.01)
        with pytest.raises(Overloaded):
            await executor.run_code(call.model_copy(update={"code": "x += 1"}))
        assert (await slow).status == RunStatus.Success
        # The refused call held the session's turn; a later call must get it (not wait forever).
        after = await asyncio.wait_for(executor.run_code(call.model_copy(update={"code": "print(x + 1)"})), 60)
        assert after.status == RunStatus.Success and after.run_result and after.run_result.stdout == "42\n"
        assert session in executor.sessions


async def test_a_cancelled_call_keeps_its_session_busy_until_it_ends() -> None:
    """A client that went away cancels its wait, not the call: the session's next call waits for it."""
    async with Executor(ExecutorConfig(slots=1, sandboxes=1, preload=())) as executor:
        session = (await executor.create_session(SessionCreateRequest(language="python"))).session_id
        first = asyncio.ensure_future(executor.run_code(RunCodeRequest(
            code="import time\ntime.sleep(1)\nx = 42", language="python", session_id=session)))
        await wait_until_async(lambda: executor.sessions[session].busy.locked(), 60, "the first call holds the session",
                               every=0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        after = await asyncio.wait_for(executor.run_code(RunCodeRequest(code="print(x)", language="python",
                                                                        session_id=session)), 60)
        assert after.status == RunStatus.Success and after.run_result and after.run_result.stdout == "42\n"
        assert not executor.sessions[session].busy.locked()


async def test_past_max_sessions_the_longest_idle_session_ends_never_a_busy_one() -> None:
    async with Executor(ExecutorConfig(slots=1, sandboxes=1, preload=(), max_sessions=2)) as executor:
        async def open_session() -> str:
            return (await executor.create_session(SessionCreateRequest(language="python"))).session_id

        def sleep_in(session: str) -> asyncio.Future:
            return asyncio.ensure_future(executor.run_code(RunCodeRequest(
                code="import time\ntime.sleep(1)\nprint('done')", language="python", session_id=session)))

        async def until_busy(*sessions: str) -> None:
            await wait_until_async(lambda: all(executor.sessions[session].busy.locked() for session in sessions), 60,
                                   f"sessions {sessions} are running a call", every=0.01)

        first, second = await open_session(), await open_session()
        running = sleep_in(first)
        await until_busy(first)
        executor.sessions[first].idle_since = 0.0  # the longest idle by its clock, yet running a call
        third = await open_session()
        assert second not in executor.sessions and set(executor.sessions) == {first, third}  # not the busy one
        # With every session running a call, a new one is refused rather than killing a call.
        running_too = sleep_in(third)
        await until_busy(first, third)
        with pytest.raises(Overloaded, match="all running a call"):
            await open_session()
        for call in (running, running_too):
            assert (await call).run_result.stdout == "done\n"


async def test_hundreds_of_sessions_under_a_soft_open_files_limit_of_1024() -> None:
    """A session holds several descriptors in its zygote: the zygote raises its own limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        async with Executor(ExecutorConfig(sandboxes=1, preload=(), max_sessions=256)) as executor:
            sessions = [(await executor.create_session(SessionCreateRequest())).session_id for _ in range(200)]
            last = await executor.run_code(RunCodeRequest(code="print(1)", language="python", session_id=sessions[-1]))
            assert last.run_result is not None and last.run_result.stdout == "1\n"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
