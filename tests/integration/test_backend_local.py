"""LocalSandboxBackend: the real executor in this process, started lazily, once."""

from __future__ import annotations

import asyncio

import pytest

from tests.waiting import wait_until_async
from verl_sf.backends.base import SandboxUnavailable
from verl_sf.backends.config import LocalBackendConfig, parse_backend_config
from verl_sf.backends.local import LocalSandboxBackend
from verl_sf.errors import SessionGone
from verl_sf.executor import ExecutorConfig, IsolationMode
from verl_sf.models import CommandRunStatus, RunCodeRequest, RunJupyterRequest, RunStatus


def test_options_map_to_executor_config() -> None:
    config = parse_backend_config({"type": "local", "executor": {"workers": 3, "isolation": "none",
                                                                  "preload": ["math"]}})
    assert isinstance(config, LocalBackendConfig) and isinstance(config.build(), LocalSandboxBackend)
    executor = config.executor
    assert (executor.slots, executor.isolation, executor.preload) == (3, IsolationMode.none, ("math",))
    assert config.key() == LocalBackendConfig(executor=ExecutorConfig(slots=3, isolation=IsolationMode.none,
                                                                      preload=("math",))).key()
    with pytest.raises(ValueError, match=r"executor\.bogus\n  Unexpected keyword argument"):
        parse_backend_config({"type": "local", "executor": {"bogus": 2}})
    with pytest.raises(ValueError, match=r"executor\.isolation\n  Input should be 'auto', 'namespaces', 'landlock' or 'none'"):
        parse_backend_config({"type": "local", "executor": {"isolation": "docker"}})


async def test_starts_on_first_call_and_only_once() -> None:
    backend = LocalSandboxBackend(LocalBackendConfig(executor=ExecutorConfig(slots=2, max_in_flight=64)))
    assert backend._executor is None  # construction starts nothing
    try:
        first, *rest = await asyncio.gather(*(backend.run_code(RunCodeRequest(code=f"print({i})", language="python"))
                                              for i in range(6)))
        executor = backend._executor
        assert executor is not None and executor.config.slots == 2
        assert [r.run_result.stdout for r in [first, *rest]] == [f"{i}\n" for i in range(6)]
        timed_out = await backend.run_code(RunCodeRequest(code="while True: pass", language="python", run_timeout=1))
        assert timed_out.status == RunStatus.Failed
        assert timed_out.run_result.status == CommandRunStatus.TimeLimitExceeded
        jupyter = await backend.run_jupyter(RunJupyterRequest(cells=["x = 20", "print(x + 22)"]))
        assert jupyter.status == RunStatus.Success and jupyter.cells[1].stdout == "42\n"
        assert backend._executor is executor
    finally:
        await backend.close()
        await backend.close()  # idempotent
    assert backend._executor is None


async def test_overload_is_sandbox_unavailable() -> None:
    backend = LocalSandboxBackend(LocalBackendConfig(executor=ExecutorConfig(slots=1, max_in_flight=1)))
    try:
        slow = asyncio.ensure_future(backend.run_code(
            RunCodeRequest(code="import time; time.sleep(2)", language="python")))
        await wait_until_async(lambda: backend._executor is not None and backend._executor.stats.in_flight > 0, 60,
                               "the slow run is in flight")
        with pytest.raises(SandboxUnavailable, match="local executor overloaded"):
            await backend.run_code(RunCodeRequest(code="print(1)", language="python"))
        assert (await slow).status == RunStatus.Success
    finally:
        await backend.close()


async def test_a_session_the_executor_ended_is_session_gone_then_starts_afresh() -> None:
    backend = LocalSandboxBackend(LocalBackendConfig(executor=ExecutorConfig(slots=1, sandboxes=1, preload=())))
    try:
        first = await backend.run_code(RunCodeRequest(code="x = 1", language="python"), session="traj")
        assert backend._executor is not None and first.session_id is not None
        backend._executor.end_session(first.session_id)  # as the idle TTL or the session cap would
        with pytest.raises(SessionGone) as gone:
            await backend.run_code(RunCodeRequest(code="print(x)", language="python"), session="traj")
        assert gone.value.session_id == first.session_id and gone.value.reason
        fresh = await backend.run_code(RunCodeRequest(code="print('x' in globals())", language="python"),
                                       session="traj")
        assert fresh.session_id != first.session_id and fresh.run_result.stdout == "False\n"
    finally:
        await backend.close()
