"""DaytonaSandboxBackend against the `daytona` SDK's real interfaces.

Daytona cannot be reached from here, so `FakeDaytona` stands in for the service: it has
exactly the method signatures of the SDK's `AsyncDaytona`, `AsyncSandbox`, `AsyncProcess`
and `AsyncFileSystem` (checked with inspect.signature below), takes and returns the SDK's
own parameter/response classes, and runs each command the backend sends in a real local
shell, in a private directory per sandbox.  So the commands we build (base64 shipping,
`timeout`, `ulimit`, stdin, files) are really executed; only the cloud is missing.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import inspect
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any, Optional

import pytest
from daytona import (
    AsyncDaytona,
    AsyncSandbox,
    CreateSandboxFromSnapshotParams,
    DaytonaError,
    SessionExecuteRequest,
    SessionExecuteResponse,
)
from daytona._async.filesystem import AsyncFileSystem
from daytona._async.process import AsyncProcess
from daytona._async.sandbox import AsyncPaginatedSandboxes

from tests.waiting import wait_until_async
from verl_sf.backends.base import SandboxUnavailable
from verl_sf.backends.config import DaytonaBackendConfig
from verl_sf.backends.daytona import (
    LABEL_CREATED,
    LABEL_MANAGED,
    LABEL_RUN,
    DaytonaSandboxBackend,
    reap_leaked_sandboxes,
)
from verl_sf.models import CommandRunStatus, RunCodeRequest, RunStatus
from verl_sf.tools import SandboxFusionTool


class FakeFileSystem:
    def __init__(self, root: str):
        self.root = root

    async def upload_file(self, src: str | bytes, dst: str, timeout: int = 1800) -> None:
        assert isinstance(src, bytes) and dst.startswith(self.root)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(src)

    async def download_file(self, *args: str) -> bytes | None:
        with open(args[0], "rb") as f:
            return f.read()


class FakeProcess:
    def __init__(self, sandbox: FakeSandbox):
        self.sandbox = sandbox
        self.shell_sessions: set[str] = set()
        self.commands: list[str] = []

    async def create_session(self, session_id: str) -> None:
        self.shell_sessions.add(session_id)

    async def execute_session_command(self, session_id: str, req: SessionExecuteRequest,
                                      timeout: int | None = None) -> SessionExecuteResponse:
        assert isinstance(req, SessionExecuteRequest) and req.run_async is False
        if session_id not in self.shell_sessions:
            raise DaytonaError(f"session {session_id} not found")
        if self.sandbox.deleted:
            raise DaytonaError("sandbox not found")
        self.commands.append(req.command)
        proc = await asyncio.create_subprocess_shell(req.command, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.PIPE, cwd=self.sandbox.root)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise DaytonaError("Failed to execute session command: request timed out") from None
        return SessionExecuteResponse.model_construct(cmd_id=uuid.uuid4().hex, output=(out + err).decode(),
                                                      stdout=out.decode(), stderr=err.decode(),
                                                      exit_code=proc.returncode)


class FakeSandbox:
    def __init__(self, labels: dict[str, str]):
        self.id = uuid.uuid4().hex
        self.labels = labels
        self.root = tempfile.mkdtemp(prefix="fake-daytona-")
        self.deleted = False
        self.process = FakeProcess(self)
        self.fs = FakeFileSystem(self.root)

    async def get_work_dir(self) -> str:
        return self.root


class FakeDaytona:
    """AsyncDaytona's methods, backed by local directories and shells."""

    def __init__(self, fail_create: bool = False):
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.created = 0
        self.fail_create = fail_create
        self.closed = False

    async def create(self, params: Optional[CreateSandboxFromSnapshotParams] = None, *, timeout: float = 60,
                     on_snapshot_create_logs: Optional[Callable[[str], None]] = None) -> FakeSandbox:
        assert isinstance(params, CreateSandboxFromSnapshotParams)
        if self.fail_create:
            raise DaytonaError("Failed to create sandbox: quota exceeded")
        self.created += 1
        sandbox = FakeSandbox(dict(params.labels or {}))
        self.sandboxes[sandbox.id] = sandbox
        return sandbox

    async def delete(self, sandbox: FakeSandbox, timeout: float = 60) -> None:
        sandbox.deleted = True
        shutil.rmtree(sandbox.root, ignore_errors=True)
        self.sandboxes.pop(sandbox.id, None)

    async def list(self, labels: Optional[dict[str, str]] = None, page: Optional[int] = None,
                   limit: Optional[int] = None) -> AsyncPaginatedSandboxes:
        matching = [s for s in self.sandboxes.values() if all(s.labels.get(k) == v for k, v in (labels or {}).items())]
        limit = limit or 100
        page = page or 1
        total_pages = max(1, -(-len(matching) // limit))
        items = matching[(page - 1) * limit: page * limit]
        return AsyncPaginatedSandboxes.model_construct(items=items, total=len(matching), page=page,
                                                       total_pages=total_pages)

    async def close(self) -> None:
        self.closed = True

    def live(self) -> list[FakeSandbox]:
        return list(self.sandboxes.values())


def _params(fn: Callable) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("fake, real", [
    (FakeDaytona.create, AsyncDaytona.create), (FakeDaytona.delete, AsyncDaytona.delete),
    (FakeDaytona.list, AsyncDaytona.list), (FakeDaytona.close, AsyncDaytona.close),
    (FakeSandbox.get_work_dir, AsyncSandbox.get_work_dir),
    (FakeProcess.create_session, AsyncProcess.create_session),
    (FakeProcess.execute_session_command, AsyncProcess.execute_session_command),
    (FakeFileSystem.upload_file, AsyncFileSystem.upload_file),
    (FakeFileSystem.download_file, AsyncFileSystem.download_file),
])
def test_fake_matches_sdk_signatures(fake: Callable, real: Callable) -> None:
    assert _params(fake) == _params(real)
    assert inspect.iscoroutinefunction(inspect.unwrap(real)) and inspect.iscoroutinefunction(fake)


def test_fake_sandbox_has_the_attributes_the_backend_uses() -> None:
    for attribute in ("id", "labels", "process", "fs", "get_work_dir"):
        assert attribute in AsyncSandbox.model_fields or hasattr(AsyncSandbox, attribute)


@pytest.fixture
def fake() -> FakeDaytona:
    client = FakeDaytona()
    yield client
    for sandbox in client.live():
        shutil.rmtree(sandbox.root, ignore_errors=True)


def req(code: str, **kw: Any) -> RunCodeRequest:
    return RunCodeRequest(code=code, language=kw.pop("language", "python"), **kw)


async def test_run_separates_streams_and_labels_the_sandbox(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(DaytonaBackendConfig(labels={"team": "rl"}), client=fake)
    response = await backend.run_code(req("import sys\nprint('out')\nprint('err', file=sys.stderr)"), session="t1")
    assert response.status == RunStatus.Success
    assert response.run_result.stdout == "out\n" and response.run_result.stderr == "err\n"
    (sandbox,) = fake.live()
    assert sandbox.labels[LABEL_MANAGED] == "true" and sandbox.labels["team"] == "rl"
    assert sandbox.labels[LABEL_RUN] == backend.run_id
    assert abs(int(sandbox.labels[LABEL_CREATED]) - time.time()) < 60
    await backend.close()
    assert fake.live() == [] and fake.closed


async def test_one_sandbox_per_session_reused_across_turns(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(client=fake)
    await backend.run_code(req("open('state.txt', 'w').write('kept')"), session="traj-a")
    second = await backend.run_code(req("print(open('state.txt').read())"), session="traj-a")
    other = await backend.run_code(req("import os; print(os.path.exists('state.txt'))"), session="traj-b")
    assert second.run_result.stdout == "kept\n" and other.run_result.stdout == "False\n"
    assert fake.created == 2
    await backend.end_session("traj-a")
    assert [s.labels["verl-sf-session"] for s in fake.live()] == ["traj-b"]
    await backend.close()


async def test_concurrent_first_calls_of_a_session_create_one_sandbox(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(client=fake)
    results = await asyncio.gather(*(backend.run_code(req(f"print({i})"), session="s") for i in range(4)))
    assert [r.run_result.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert fake.created == 1
    await backend.close()


async def test_call_without_session_gets_a_throwaway_sandbox(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(client=fake)
    response = await backend.run_code(req("print(2 + 2)"))
    assert response.run_result.stdout == "4\n" and fake.created == 1 and fake.live() == []
    await backend.close()


async def test_timeout_exception_stdin_files_and_memory(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(client=fake)
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


async def test_failures_become_sandbox_unavailable_and_the_sandbox_is_replaced(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(client=FakeDaytona(fail_create=True))
    with pytest.raises(SandboxUnavailable, match="quota exceeded"):
        await backend.run_code(req("print(1)"), session="s")
    assert backend.sessions() == []

    backend = DaytonaSandboxBackend(client=fake)
    await backend.run_code(req("print(1)"), session="s")
    (first,) = fake.live()
    first.deleted = True  # e.g. Daytona auto-stopped and deleted it
    with pytest.raises(SandboxUnavailable, match="sandbox not found"):
        await backend.run_code(req("print(1)"), session="s")
    again = await backend.run_code(req("print(2)"), session="s")
    assert again.run_result.stdout == "2\n" and fake.created == 2
    await backend.close()


async def test_reaper_deletes_only_old_verl_sf_sandboxes_across_pages(fake: FakeDaytona) -> None:
    backend = DaytonaSandboxBackend(client=fake)
    for i in range(5):
        await backend.run_code(req("pass"), session=f"s{i}")
    foreign = await fake.create(CreateSandboxFromSnapshotParams(labels={"owner": "someone-else"}))
    for sandbox in fake.live()[:3]:
        sandbox.labels[LABEL_CREATED] = str(int(time.time()) - 7200)  # leaked two hours ago
    old = {s.id for s in fake.live()[:3]}
    deleted = await reap_leaked_sandboxes(fake, older_than_s=3600, page_size=2)
    assert set(deleted) == old and len(fake.live()) == 3 and foreign.id in {s.id for s in fake.live()}
    assert await reap_leaked_sandboxes(fake, older_than_s=0, run_id="another-run") == []
    assert len(await reap_leaked_sandboxes(fake, older_than_s=0, run_id=backend.run_id)) == 2
    assert [s.id for s in fake.live()] == [foreign.id]
    await fake.delete(foreign)


class _AgentData:
    """The one attribute of verl's AgentData the tool reads."""

    def __init__(self, request_id: str):
        self.request_id = request_id


async def test_tool_keys_sandboxes_on_the_trajectory_and_deletes_them_when_it_ends(
        fake: FakeDaytona, monkeypatch: pytest.MonkeyPatch) -> None:
    import daytona

    monkeypatch.setattr(daytona, "AsyncDaytona", lambda: fake)
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
    assert fake.created == 1 and len(fake.live()) == 1
    # verl's full_determinism gives every trajectory the same request_id: still one sandbox each.
    twin = _AgentData("req-1")
    instance_id, _ = await tool.create()
    response, _, _ = await tool.execute(instance_id, {"code": "import os; print(os.path.exists('x'))"},
                                        agent_data=twin)
    await tool.release(instance_id)
    assert response.text == "False" and fake.created == 2
    del trajectory, twin
    gc.collect()
    await wait_until_async(lambda: fake.live() == [], 2, "the collected trajectories' sandboxes are deleted",
                           every=0.02)

    # Without a trajectory, the instance is the session: release ends it.
    instance_id, _ = await tool.create(ground_truth="4")
    response, _, _ = await tool.execute(instance_id, {"code": "print(2 + 2)"})
    assert response.text == "4" and len(fake.live()) == 1
    await tool.release(instance_id)
    assert fake.live() == []
    await tool.close()
