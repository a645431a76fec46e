"""DaytonaSandboxBackend and the tool's `backend: daytona` through the real `daytona` SDK, against
`verl-sf serve`'s Daytona API (DAYTONA_API_URL and DAYTONA_API_KEY name it, as they would name
Daytona's cloud): sandboxes, session shells, files and labels are the server's, not stand-ins.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig, ListSandboxesQuery

from tests.server_fixtures import ServerHandle, daytona_env, server_for_sdk
from tests.waiting import wait_until_async
from verl_sf.backends.base import SandboxUnavailable
from verl_sf.backends.config import DaytonaBackendConfig
from verl_sf.backends.daytona import (
    LABEL_CREATED,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_SESSION,
    DaytonaSandboxBackend,
    reap_leaked_sandboxes,
)
from verl_sf.models import CommandRunStatus, RunCodeRequest, RunStatus
from verl_sf.tools import SandboxFusionTool

KEY = "daytona-backend-key"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with server_for_sdk(daytona_env(KEY), "--preload", "", "--daytona-api-key", KEY) as handle:
        yield handle


@pytest.fixture
async def daytona(server: ServerHandle) -> AsyncIterator[AsyncDaytona]:
    """A client of its own, to look at (and meddle with) the sandboxes the backend makes."""
    client = AsyncDaytona()
    yield client
    async for sandbox in client.list():
        await sandbox.delete()
    await client.close()


async def live(daytona: AsyncDaytona, **labels: str) -> list[Any]:
    return [s async for s in daytona.list(ListSandboxesQuery(labels=labels or None))]


def req(code: str, **kw: Any) -> RunCodeRequest:
    return RunCodeRequest(code=code, language=kw.pop("language", "python"), **kw)


async def test_run_separates_streams_and_labels_the_sandbox(daytona: AsyncDaytona) -> None:
    backend = DaytonaSandboxBackend(DaytonaBackendConfig(labels={"team": "rl"}))
    response = await backend.run_code(req("import sys\nprint('out')\nprint('err', file=sys.stderr)"), session="t1")
    assert response.status == RunStatus.Success
    assert response.run_result.stdout == "out\n" and response.run_result.stderr == "err\n"
    (sandbox,) = await live(daytona)
    assert sandbox.labels[LABEL_MANAGED] == "true" and sandbox.labels["team"] == "rl"
    assert sandbox.labels[LABEL_RUN] == backend.run_id and sandbox.labels[LABEL_SESSION] == "t1"
    assert abs(int(sandbox.labels[LABEL_CREATED]) - time.time()) < 60
    assert sandbox.auto_stop_interval == 15 and sandbox.auto_delete_interval == 0
    await backend.close()
    assert await live(daytona) == []


async def test_one_sandbox_per_session_reused_across_turns(daytona: AsyncDaytona) -> None:
    backend = DaytonaSandboxBackend()
    await backend.run_code(req("open('state.txt', 'w').write('kept')"), session="traj-a")
    second = await backend.run_code(req("print(open('state.txt').read())"), session="traj-a")
    other = await backend.run_code(req("import os; print(os.path.exists('state.txt'))"), session="traj-b")
    assert second.run_result.stdout == "kept\n" and other.run_result.stdout == "False\n"
    assert len(await live(daytona)) == 2
    await backend.end_session("traj-a")
    assert [s.labels[LABEL_SESSION] for s in await live(daytona)] == ["traj-b"]
    await backend.close()


async def test_concurrent_first_calls_of_a_session_create_one_sandbox(daytona: AsyncDaytona) -> None:
    backend = DaytonaSandboxBackend()
    results = await asyncio.gather(*(backend.run_code(req(f"print({i})"), session="s") for i in range(4)))
    assert [r.run_result.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert len(await live(daytona)) == 1
    await backend.close()


async def test_call_without_session_gets_a_throwaway_sandbox(daytona: AsyncDaytona) -> None:
    backend = DaytonaSandboxBackend()
    response = await backend.run_code(req("print(2 + 2)"))
    assert response.run_result.stdout == "4\n" and await live(daytona) == []
    await backend.close()


async def test_timeout_exception_stdin_files_and_memory(daytona: AsyncDaytona) -> None:
    backend = DaytonaSandboxBackend()
    slow = await backend.run_code(req("import time\nprint('started', flush=True)\ntime.sleep(10)", run_timeout=1),
                                  session="s")
    assert slow.status == RunStatus.Failed and slow.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert slow.run_result.stdout == "started\n"
    boom = await backend.run_code(req("1/0"), session="s")
    assert boom.status == RunStatus.Failed and "ZeroDivisionError" in boom.run_result.stderr
    echo = await backend.run_code(req("print(input()[::-1])", stdin="abc\n"), session="s")
    assert echo.run_result.stdout == "cba\n"
    files = await backend.run_code(
        req("print(open('in.txt').read()); open('out.txt', 'w').write('x')",
            files={"in.txt": base64.b64encode(b"hello").decode()}, fetch_files=["out.txt"]), session="s")
    assert files.run_result.stdout == "hello\n" and base64.b64decode(files.files["out.txt"]) == b"x"
    hog = await backend.run_code(req("x = bytearray(512 * 1024 * 1024)\nprint('allocated')", memory_limit_MB=128),
                                 session="s")
    assert hog.status == RunStatus.Failed and "MemoryError" in hog.run_result.stderr
    bash = await backend.run_code(req("echo $((6 * 7))", language="bash"), session="s")
    assert bash.run_result.stdout == "42\n"
    unsupported = await backend.run_code(req("int main(){}", language="cpp"), session="s")
    assert unsupported.status == RunStatus.SandboxError and "cpp" in unsupported.message
    await backend.close()


async def test_failures_become_sandbox_unavailable_and_the_sandbox_is_replaced(server: ServerHandle,
                                                                                daytona: AsyncDaytona) -> None:
    refused = AsyncDaytona(DaytonaConfig(api_key="not-the-key", api_url=f"{server.url}/api"))
    backend = DaytonaSandboxBackend(client=refused)
    with pytest.raises(SandboxUnavailable, match="invalid API key"):
        await backend.run_code(req("print(1)"), session="s")
    assert backend.sessions() == []
    await backend.close()

    backend = DaytonaSandboxBackend()
    await backend.run_code(req("print(1)"), session="s")
    (first,) = await live(daytona)
    await first.delete()  # e.g. Daytona auto-stopped and deleted it
    with pytest.raises(SandboxUnavailable, match="not found"):
        await backend.run_code(req("print(1)"), session="s")
    again = await backend.run_code(req("print(2)"), session="s")
    (second,) = await live(daytona)
    assert again.run_result.stdout == "2\n" and second.id != first.id
    await backend.close()


async def test_reaper_deletes_only_old_verl_sf_sandboxes_across_pages(daytona: AsyncDaytona) -> None:
    backend = DaytonaSandboxBackend()
    for i in range(5):
        await backend.run_code(req("pass"), session=f"s{i}")
    foreign = await daytona.create(CreateSandboxFromSnapshotParams(labels={"owner": "someone-else"}))
    ours = await live(daytona, **{LABEL_MANAGED: "true"})
    for sandbox in ours[:3]:  # leaked two hours ago
        await sandbox.set_labels({**sandbox.labels, LABEL_CREATED: str(int(time.time()) - 7200)})
    deleted = await reap_leaked_sandboxes(daytona, older_than_s=3600, page_size=2)
    assert set(deleted) == {s.id for s in ours[:3]}
    assert {s.id for s in await live(daytona)} == {s.id for s in ours[3:]} | {foreign.id}
    assert await reap_leaked_sandboxes(daytona, older_than_s=0, run_id="another-run") == []
    assert len(await reap_leaked_sandboxes(daytona, older_than_s=0, run_id=backend.run_id)) == 2
    assert [s.id for s in await live(daytona)] == [foreign.id]


class _AgentData:
    """The one attribute of verl's AgentData the tool reads."""

    def __init__(self, request_id: str):
        self.request_id = request_id


async def test_tool_keys_sandboxes_on_the_trajectory_and_deletes_them_when_it_ends(daytona: AsyncDaytona) -> None:
    tool = SandboxFusionTool({"backend": "daytona", "pool": "inprocess", "default_timeout": 5})
    trajectory = _AgentData("req-1")
    for code, expected in [("x = 6 * 7", "(no output; print() the values you want to see)"),
                           ("open('x', 'w').write('42')", "(no output; print() the values you want to see)"),
                           ("print(open('x').read())", "42")]:
        # exactly ToolAgentLoop._call_tool's sequence: create -> execute(agent_data=) -> release
        instance_id, _ = await tool.create(create_kwargs={})
        response, reward, metrics = await tool.execute(instance_id, {"code": code}, agent_data=trajectory)
        await tool.release(instance_id)
        assert response.text == expected and reward is None and metrics["backend"] == "daytona"
    assert len(await live(daytona)) == 1
    # verl's full_determinism gives every trajectory the same request_id: still one sandbox each.
    twin = _AgentData("req-1")
    instance_id, _ = await tool.create()
    response, _, _ = await tool.execute(instance_id, {"code": "import os; print(os.path.exists('x'))"},
                                        agent_data=twin)
    await tool.release(instance_id)
    assert response.text == "False" and len(await live(daytona)) == 2
    del trajectory, twin
    gc.collect()

    async def none_left() -> bool:
        return await live(daytona) == []
    await wait_until_async(none_left, 10, "the collected trajectories' sandboxes are deleted")

    # Without a trajectory, the instance is the session: release ends it.
    instance_id, _ = await tool.create(ground_truth="4")
    response, _, _ = await tool.execute(instance_id, {"code": "print(2 + 2)"})
    assert response.text == "4" and len(await live(daytona)) == 1
    await tool.release(instance_id)
    assert await live(daytona) == []
    await tool.close()
