"""Forks and snapshots through the backends (`http` against a real server, `local` on the real executor).

The same scenario runs on each: a key's session forked into new keys, snapshotted, opened from the
snapshot under other keys, and every refusal as the typed error every layer shares (SessionGone,
SnapshotGone, SessionBusy).  The cluster backend's routing is tests/integration/test_cluster.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
import requests

from tests.server_fixtures import ServerHandle, start_server, stop_server
from tests.waiting import wait_until_async
from verl_sf.backends.http import HttpSandboxBackend
from verl_sf.backends.local import LocalBackendConfig, LocalSandboxBackend
from verl_sf.backends.sessions import ServerSessionBackend
from verl_sf.errors import InvalidRequest, SessionBusy, SessionGone, SnapshotGone
from verl_sf.executor import ExecutorConfig
from verl_sf.models import RunCodeRequest, RunStatus


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "")
    yield handle
    stop_server(handle.process)


@pytest_asyncio.fixture(params=["http", "local"])
async def backend(request: pytest.FixtureRequest, server: ServerHandle) -> AsyncIterator[ServerSessionBackend]:
    made: ServerSessionBackend
    if request.param == "http":
        made = HttpSandboxBackend(server.url)
    else:
        made = LocalSandboxBackend(LocalBackendConfig(executor=ExecutorConfig(slots=2, preload=())))
    yield made
    await made.close()


async def run(backend: ServerSessionBackend, session: str, code: str, language: str = "python") -> str:
    response = await backend.run_code(RunCodeRequest(code=code, language=language), session=session)
    assert response.status == RunStatus.Success, response
    return str(response.run_result.stdout)  # type: ignore[union-attr]


async def test_forks_get_new_keys_holding_the_parents_state(backend: ServerSessionBackend) -> None:
    await run(backend, "parent", "x = 41\nopen('notes.txt', 'w').write('from the parent')")
    forks = await backend.fork_session("parent", 3)
    assert len(set(forks)) == 3 and "parent" not in forks
    assert set(backend.sessions()) == {"parent", *forks}
    outputs = await asyncio.gather(*(run(backend, key, f"x += {i}\nprint(x, open('notes.txt').read())")
                                     for i, key in enumerate(forks)))
    assert outputs == [f"{41 + i} from the parent\n" for i in range(3)]
    assert await run(backend, "parent", "print(x)") == "41\n", "the forks' writes are their own"
    await backend.end_session(forks[0])
    assert forks[0] not in backend.sessions()
    assert await run(backend, forks[1], "print(x)") == "42\n", "ending a fork leaves its siblings"


async def test_bash_sessions_fork_under_their_language(backend: ServerSessionBackend) -> None:
    await run(backend, "shell", "cd /tmp && export MARK=kept", language="bash")
    [fork] = await backend.fork_session("shell", language="bash")
    assert await run(backend, fork, "echo $PWD $MARK", language="bash") == "/tmp kept\n"


async def test_a_snapshot_opens_sessions_under_other_keys(backend: ServerSessionBackend) -> None:
    await run(backend, "source", "import json\nstate = {'loaded': 3}")
    snapshot = await backend.snapshot_session("source")
    assert snapshot.language == "python" and snapshot.sessions_started == 0
    opened = await asyncio.gather(*(backend.open_session(f"copy-{i}", from_snapshot=snapshot.snapshot_id)
                                    for i in range(2)))
    assert len(set(opened)) == 2
    assert await backend.open_session("copy-0", from_snapshot=snapshot.snapshot_id) == opened[0], \
        "a key already open keeps its session"
    outputs = [await run(backend, f"copy-{i}", "state['loaded'] += 1\nprint(json.dumps(state))") for i in range(2)]
    assert outputs == ['{"loaded": 4}\n'] * 2
    await backend.delete_snapshot(snapshot.snapshot_id)
    await backend.delete_snapshot(snapshot.snapshot_id)  # idempotent: already gone is what was asked
    with pytest.raises(SnapshotGone) as gone:
        await backend.open_session("copy-2", from_snapshot=snapshot.snapshot_id)
    assert gone.value.snapshot_id == snapshot.snapshot_id and "deleted" in gone.value.reason
    assert "copy-2" not in backend.sessions(), "a failed open leaves the key free"
    assert await run(backend, "copy-1", "print(state)") == "{'loaded': 4}\n", "opened sessions outlive the snapshot"


async def test_a_snapshots_language_is_its_own(backend: ServerSessionBackend) -> None:
    await run(backend, "py", "x = 1")
    snapshot = await backend.snapshot_session("py")
    try:
        with pytest.raises(ValueError, match="holds a python session, not a bash one"):
            await backend.open_session("as-bash", "bash", from_snapshot=snapshot.snapshot_id)
        assert "as-bash" not in backend.sessions()
    finally:
        await backend.delete_snapshot(snapshot.snapshot_id)


def in_flight(backend: ServerSessionBackend, server: ServerHandle) -> bool:
    """A call is running on the backend's executor (the server's, or the local one)."""
    if isinstance(backend, LocalSandboxBackend):
        return backend._executor is not None and backend._executor.stats.in_flight > 0
    return bool(requests.get(server.url + "/health", timeout=30).json()["in_flight"])


async def test_refusals_are_the_shared_typed_errors(backend: ServerSessionBackend, server: ServerHandle) -> None:
    with pytest.raises(SessionGone, match="no python session is open under this key"):
        await backend.fork_session("never-opened")
    with pytest.raises(SessionGone):
        await backend.snapshot_session("never-opened")
    await run(backend, "busy", "import time")
    long_call = asyncio.ensure_future(run(backend, "busy", "time.sleep(4)\nprint('finished')"))
    try:
        await wait_until_async(lambda: in_flight(backend, server), 30, "the long call is running")
        with pytest.raises(SessionBusy, match="call is running") as busy:
            await backend.fork_session("busy", 2)
        assert busy.value.reason.startswith("a call is running")  # the server's own reason, rebuilt from its code
        with pytest.raises(SessionBusy):
            await backend.snapshot_session("busy")
    finally:
        assert await long_call == "finished\n"
    assert backend.sessions() == ["busy"], "a refused fork binds no key"


async def test_a_fork_of_a_session_the_server_ended_is_session_gone_and_frees_the_key(
        backend: ServerSessionBackend, server: ServerHandle) -> None:
    response = await backend.run_code(RunCodeRequest(code="x = 1", language="python"), session="doomed")
    assert response.session_id is not None
    if isinstance(backend, HttpSandboxBackend):
        requests.delete(f"{server.url}/sessions/{response.session_id}", timeout=30)
    else:
        assert isinstance(backend, LocalSandboxBackend) and backend._executor is not None
        backend._executor.end_session(response.session_id)
    with pytest.raises(SessionGone) as gone:
        await backend.fork_session("doomed")
    assert gone.value.session_id == response.session_id
    assert "doomed" not in backend.sessions()


async def test_close_ends_the_forks_too(server: ServerHandle) -> None:
    def live() -> int:
        return int(requests.get(server.url + "/health", timeout=30).json()["sessions"])

    before = live()
    backend = HttpSandboxBackend(server.url)
    await run(backend, "root", "x = 1")
    await backend.fork_session("root", 4)
    assert live() == before + 5
    await backend.close()
    await wait_until_async(lambda: live() == before, 10, "every session and fork the backend made has ended")


async def test_a_field_the_server_refuses_is_the_same_error_through_either_backend(
        backend: ServerSessionBackend) -> None:
    """The contract: the `http` backend rebuilds the server's refusal from its `code`, `reason` and
    `field` as the type the `local` backend raises (errors.ANSWERS)."""
    with pytest.raises(InvalidRequest) as refused:
        await backend.run_code(RunCodeRequest(code="echo a\0b", language="bash"), session="nul-bytes")
    assert refused.value.field == "code" and "NUL" in str(refused.value)
    assert await run(backend, "nul-bytes", "echo fine", language="bash") == "fine\n"  # the session lives on


async def _bash_stdin(backend: ServerSessionBackend) -> None:
    await backend.run_code(RunCodeRequest(code="cat", language="bash", stdin="x"), session="stdin")


async def _session_files(backend: ServerSessionBackend) -> None:
    await run(backend, "files", "x = 1")
    await backend.run_code(RunCodeRequest(code="1", language="python", files={"a.txt": "eA=="}), session="files")


async def _unknown_snapshot(backend: ServerSessionBackend) -> None:
    await backend.open_session("from-nothing", from_snapshot="snap-000000-0000000000000000")


async def _snapshot_in_another_language(backend: ServerSessionBackend) -> None:
    await run(backend, "py-source", "x = 1")
    snapshot = await backend.snapshot_session("py-source")
    await backend.open_session("bash-copy", "bash", from_snapshot=snapshot.snapshot_id)


async def _fork_of_nothing(backend: ServerSessionBackend) -> None:
    await backend.fork_session("never-opened")


@pytest.mark.parametrize(("bad_input", "error", "field", "words"), [
    (_bash_stdin, InvalidRequest, "stdin", "takes no stdin"),
    (_session_files, InvalidRequest, "files", "files are given when a session is created"),
    (_unknown_snapshot, SnapshotGone, None, "the server restarted since it was taken"),
    (_snapshot_in_another_language, InvalidRequest, "language", "holds a python session, not a bash one"),
    (_fork_of_nothing, SessionGone, None, "no python session is open under this key"),
], ids=lambda value: getattr(value, "__name__", None))
async def test_the_same_bad_input_is_the_same_error_through_either_backend(
        backend: ServerSessionBackend, bad_input: object, error: type[Exception], field: str | None,
        words: str) -> None:
    with pytest.raises(error, match=words) as refused:
        await bad_input(backend)  # type: ignore[operator]
    assert getattr(refused.value, "field", None) == field
    assert await run(backend, "after", "print('served')") == "served\n"  # the backend serves on
