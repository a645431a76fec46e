"""The real, unmodified `daytona` SDK against a real `verl-sf serve`.

The SDK is configured only as its users configure it: DAYTONA_API_URL names the server's /api and
DAYTONA_API_KEY carries a key.  Every test asserts what the SDK hands its caller; a few hostile
checks speak raw HTTP and raw websockets.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import requests
from daytona import (
    AsyncDaytona,
    AsyncSandbox,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaTimeoutError,
    FileUpload,
    Image,
    ListSandboxesQuery,
    Resources,
    SessionExecuteRequest,
)
from daytona.common.errors import DaytonaConflictError

from tests.host_view import comm, descendants
from tests.server_fixtures import ServerHandle, daytona_env, server_for_sdk, start_server, stop_server
from tests.waiting import wait_until, wait_until_async

KEY = "daytona-test-key-a"
OTHER_KEY = "daytona-test-key-b"
SDK_VERSION = tuple(int(part) for part in importlib.metadata.version("daytona").split(".")[:2])
MINUTE_S = 2.0  # the server's minute for auto-stop and auto-delete intervals, shortened


def named(server: ServerHandle, name: str) -> list[int]:
    """The server's descendants a run named `name` (prctl; read from the host)."""
    return [pid for pid in descendants(server.process.pid) if comm(pid) == name]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with server_for_sdk(daytona_env(KEY), "--slots", "2", "--preload", "", "--daytona-minute-s", str(MINUTE_S)) as handle:
        yield handle


@pytest.fixture
async def daytona(server: ServerHandle) -> AsyncIterator[AsyncDaytona]:
    client = AsyncDaytona()
    yield client
    await client.close()


@pytest.fixture
async def sandbox(daytona: AsyncDaytona) -> AsyncIterator[AsyncSandbox]:
    box = await daytona.create()
    yield box
    await box.delete()


async def test_create_reports_a_started_sandbox_and_the_control_plane_finds_it(daytona: AsyncDaytona) -> None:
    name = f"named-{uuid.uuid4().hex[:8]}"
    params = CreateSandboxFromSnapshotParams(name=name, language="python", labels={"team": "rl", "run": name},
                                             env_vars={"GREETING": "hi"}, auto_stop_interval=5,
                                             auto_delete_interval=10)
    started = time.monotonic()
    box = await daytona.create(params, timeout=30)
    assert time.monotonic() - started < 10
    try:
        assert box.state.value == "started" and box.name == name and box.labels["team"] == "rl"
        assert box.auto_stop_interval == 5 and box.auto_delete_interval == 10 and box.env == {"GREETING": "hi"}
        assert box.cpu >= 1 and box.memory >= 1 and box.disk >= 1 and box.gpu == 0
        by_name = await daytona.get(name)
        assert by_name.id == box.id and by_name.state.value == "started"
        listed = [s.id async for s in daytona.list(ListSandboxesQuery(labels={"run": name}))]
        assert listed == [box.id]
        await box.set_labels({"team": "eval"})
        await box.refresh_data()
        assert box.labels["team"] == "eval" and "run" not in box.labels
        await box.set_autostop_interval(0)
        await box.set_auto_delete_interval(-1)
        await box.refresh_data()
        assert box.auto_stop_interval == 0 and box.auto_delete_interval == -1
    finally:
        await box.delete()
    with pytest.raises(DaytonaNotFoundError, match=f"Sandbox with ID or name {box.id} not found"):
        await daytona.get(box.id)


async def test_image_params_give_the_servers_runtime_with_the_images_environment(daytona: AsyncDaytona) -> None:
    image = Image.base("python:3.12-slim").env({"FROM_IMAGE": "a b", "OVERRIDDEN": "image"})
    box = await daytona.create(CreateSandboxFromImageParams(image=image, env_vars={"OVERRIDDEN": "params"},
                                                            resources=Resources(cpu=2, memory=4, disk=8)))
    try:
        assert (box.cpu, box.memory, box.disk) == (2, 4, 8)
        shown = await box.code_interpreter.run_code("import os\nprint(os.environ['FROM_IMAGE'], os.environ['OVERRIDDEN'])")
        assert shown.stdout == "a b params\n"
    finally:
        await box.delete()
    with pytest.raises(DaytonaError, match="RUN") as refused:  # a step nothing here would run
        await daytona.create(CreateSandboxFromImageParams(image=Image.debian_slim("3.12").pip_install(["numpy"])))
    assert refused.value.status_code == 422 and "buildInfo" in str(refused.value)


async def test_list_pages_with_a_cursor(daytona: AsyncDaytona) -> None:
    run = uuid.uuid4().hex
    boxes = await asyncio.gather(*(daytona.create(CreateSandboxFromSnapshotParams(labels={"page": run}))
                                   for _ in range(5)))
    try:
        found = [s.id async for s in daytona.list(ListSandboxesQuery(labels={"page": run}, limit=2))]
        assert sorted(found) == sorted(b.id for b in boxes)
    finally:
        await asyncio.gather(*(b.delete() for b in boxes))


async def test_interpreter_keeps_state_and_reports_output_and_errors(sandbox: AsyncSandbox) -> None:
    first = await sandbox.code_interpreter.run_code("import sys\nx = 41\nprint('out')\nprint('err', file=sys.stderr)")
    assert first.stdout == "out\n" and first.stderr == "err\n" and first.error is None
    second = await sandbox.code_interpreter.run_code("print(x + 1, __name__)\n{}['missing']")
    assert second.stdout == "42 __main__\n"
    assert second.error is not None and second.error.name == "KeyError" and second.error.value == "'missing'"
    assert "Traceback" in second.error.traceback and "verl-sf" not in second.error.traceback
    envs = await sandbox.code_interpreter.run_code("import os\nprint(os.environ.get('ONLY_HERE'))",
                                                   envs={"ONLY_HERE": "yes"})
    assert envs.stdout == "yes\n"
    after = await sandbox.code_interpreter.run_code("import os\nprint(os.environ.get('ONLY_HERE'))")
    assert after.stdout == "None\n"
    streamed: list[str] = []
    await sandbox.code_interpreter.run_code("print('a')", on_stdout=lambda m: streamed.append(m.output))
    assert streamed == ["a\n"]


async def test_a_figure_is_shown_without_an_error(sandbox: AsyncSandbox) -> None:
    """Daytona's chart example: a figure left open is shown after the code, not taken for an
    interpreter the code broke."""
    shown = await sandbox.code_interpreter.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert shown.error is None and shown.stderr == "", shown
    after = await sandbox.code_interpreter.run_code("print('next')")
    assert after.stdout == "next\n" and after.error is None


async def test_contexts_are_isolated(sandbox: AsyncSandbox) -> None:
    context = await sandbox.code_interpreter.create_context()
    await sandbox.code_interpreter.run_code("y = 'private'", context=context)
    inside = await sandbox.code_interpreter.run_code("print(y)", context=context)
    outside = await sandbox.code_interpreter.run_code("print(y)")
    assert inside.stdout == "private\n" and outside.error is not None and outside.error.name == "NameError"
    assert [c.id for c in await sandbox.code_interpreter.list_contexts()] == [context.id]
    await sandbox.code_interpreter.delete_context(context)
    assert await sandbox.code_interpreter.list_contexts() == []
    with pytest.raises(DaytonaError):
        await sandbox.code_interpreter.run_code("print(1)", context=context)


async def test_run_code_timeout_is_the_sdks_timeout_error_and_the_sandbox_lives_on(sandbox: AsyncSandbox) -> None:
    await sandbox.code_interpreter.run_code("kept = 7")
    started = time.monotonic()
    with pytest.raises(DaytonaTimeoutError):
        await sandbox.code_interpreter.run_code("while True:\n    pass", timeout=1)
    assert time.monotonic() - started < 10
    again = await sandbox.code_interpreter.run_code("print(kept)")
    assert again.stdout == "7\n" and again.error is None


@pytest.mark.skipif(SDK_VERSION < (0, 200), reason="update_env is not in this SDK release")
async def test_update_env_reaches_later_commands_and_runs(sandbox: AsyncSandbox) -> None:
    await sandbox.update_env({"SHARED": "one", "GOES": "x"})
    assert (await sandbox.process.exec("echo $SHARED $GOES")).result == "one x\n"
    await sandbox.update_env({"SHARED": "two"}, unset=["GOES"])
    seen = await sandbox.code_interpreter.run_code("import os\nprint(os.environ['SHARED'], 'GOES' in os.environ)")
    assert seen.stdout == "two False\n"


async def test_a_command_output_is_kept_to_the_output_limit(sandbox: AsyncSandbox) -> None:
    """A command's output is kept as a run's is, to the server's output limit (1 MiB) with a marker: a red
    team's command writing 150 MiB was held whole in the server's memory and encoded on its event loop."""
    flood = "head -c 3145728 /dev/zero | tr '\\0' x"
    executed = await sandbox.process.exec(f"{flood}; echo done")
    assert executed.result.startswith("x" * (1 << 20)), executed.result[:80]
    assert executed.result[1 << 20:] == "\n[verl-sf: output truncated, 2097157 more bytes not shown]\n"
    await sandbox.process.create_session("flood")
    done = await sandbox.process.execute_session_command("flood", SessionExecuteRequest(command=f"{flood} >&2"))
    assert done.stdout == "" and len(done.stderr) == (1 << 20) + len(
        "\n[verl-sf: output truncated, 2097152 more bytes not shown]\n"), done.stderr[-80:]


async def test_exec_code_run_and_process_sessions(sandbox: AsyncSandbox) -> None:
    executed = await sandbox.process.exec("echo out; echo err >&2; exit 3", env={"X": "1"})
    assert executed.exit_code == 3 and "out\n" in executed.result and "err\n" in executed.result
    env = await sandbox.process.exec("echo $X", env={"X": "from-env"})
    assert env.result == "from-env\n"
    with pytest.raises(DaytonaError, match="timeout"):  # DaytonaTimeoutError from 0.2xx on (it reads the code)
        await sandbox.process.exec("sleep 30", timeout=1)
    ran = await sandbox.process.code_run("import sys\nprint('args', sys.argv[1:])\nsys.exit(4)")
    assert ran.exit_code == 4 and ran.result == "args []\n"

    await sandbox.process.create_session("shell")
    done = await sandbox.process.execute_session_command(
        "shell", SessionExecuteRequest(command="echo one; echo two >&2", run_async=False))
    assert done.exit_code == 0 and done.stdout == "one\n" and done.stderr == "two\n"
    await sandbox.process.execute_session_command(  # a session is one shell: where it is and what it exports
        "shell", SessionExecuteRequest(command="mkdir -p sub && cd sub && export GREETING='hi there'"))
    carried = await sandbox.process.execute_session_command(
        "shell", SessionExecuteRequest(command='basename "$PWD"; echo "$GREETING"'))
    assert carried.stdout == "sub\nhi there\n"
    background = await sandbox.process.execute_session_command(
        "shell", SessionExecuteRequest(command="sleep 0.5; echo late; exit 2", run_async=True))

    async def finished() -> bool:
        command = await sandbox.process.get_session_command("shell", background.cmd_id)
        return command.exit_code is not None
    await wait_until_async(finished, 20, "the background command to end")
    logs = await sandbox.process.get_session_command_logs("shell", background.cmd_id)
    assert logs.stdout == "late\n"
    session = await sandbox.process.get_session("shell")
    assert [c.exit_code for c in session.commands] == [0, 0, 0, 2]
    await sandbox.process.execute_session_command(
        "shell", SessionExecuteRequest(command="sleep 60; touch never", run_async=True))

    async def sleeping() -> bool:
        return (await sandbox.process.exec("ps -eo args | grep -c '[s]leep 60'")).result != "0\n"
    await wait_until_async(sleeping, 20, "the long command to start")
    await sandbox.process.delete_session("shell")
    with pytest.raises(DaytonaNotFoundError):
        await sandbox.process.get_session("shell")
    assert (await sandbox.process.exec("ps -eo args | grep -c '[s]leep 60'")).result == "0\n"


async def test_files_and_one_home_for_code_commands_and_files(sandbox: AsyncSandbox) -> None:
    home = await sandbox.get_user_home_dir()
    assert await sandbox.get_work_dir() == home == "/home/user"  # the namespaces rung's one name for it
    assert (await sandbox.process.exec("pwd")).result.strip() == home
    await sandbox.fs.upload_files([FileUpload(b"a,b\n1,2\n", "data/table.csv"),
                                   FileUpload(b"\x00\xffbinary", f"{home}/blob.bin")])
    assert await sandbox.fs.download_file(f"{home}/data/table.csv") == b"a,b\n1,2\n"
    assert await sandbox.fs.download_file("blob.bin") == b"\x00\xffbinary"
    read = await sandbox.code_interpreter.run_code(f"print(open({home + '/data/table.csv'!r}).read().count(','))\n"
                                                   f"open('made-by-code.txt', 'w').write('code')")
    assert read.stdout == "2\n" and read.error is None
    assert (await sandbox.process.exec("cat made-by-code.txt")).result == "code"
    assert await sandbox.fs.download_file("made-by-code.txt") == b"code"

    names = {f.name: f for f in await sandbox.fs.list_files(home)}
    assert {"data", "blob.bin", "made-by-code.txt"} <= set(names) and names["data"].is_dir
    info = await sandbox.fs.get_file_info("blob.bin")
    assert info.size == 8 and not info.is_dir
    await sandbox.fs.create_folder("made", "755")
    await sandbox.fs.move_files("blob.bin", "made/moved.bin")
    await sandbox.fs.set_file_permissions("made/moved.bin", mode="600")
    assert (await sandbox.fs.get_file_info("made/moved.bin")).permissions == "0600"
    with pytest.raises(DaytonaError):
        await sandbox.fs.delete_file("made")  # not empty, not recursive
    await sandbox.fs.delete_file("made", recursive=True)
    with pytest.raises(DaytonaNotFoundError):
        await sandbox.fs.get_file_info("made")
    with pytest.raises(DaytonaNotFoundError):
        await sandbox.fs.download_file("never-written.txt")
    odd_names = ['name with "quotes".txt', "back\\slash.txt"]
    if SDK_VERSION >= (0, 200):  # older SDKs do not read RFC 2231 file names
        odd_names.append("ünïcode.txt")
    for odd in odd_names:
        await sandbox.fs.upload_file(odd.encode(), odd)
        assert await sandbox.fs.download_file(odd) == odd.encode()
    await sandbox.process.exec("mkfifo fifo")
    with pytest.raises(DaytonaError, match="not a regular file"):  # at once (red team, 2026-11-30: 60 s, then 408)
        await sandbox.fs.upload_file(b"x", "fifo")


FILL_THE_DISK = ("import os\ni = 0\nwhile True:\n    try:\n        with open(f'/tmp/fill{i}', 'wb') as f:\n"
                 "            f.write(b'x' * (16 << 20))\n    except OSError:\n        break\n    i += 1\n")


async def test_uploads_are_whole_or_not_at_all_and_each_part_answers(server: ServerHandle, sandbox: AsyncSandbox) -> None:
    """As Daytona's daemon: every file that can be is written, a part without a path is named in
    `errors` (200 `{"files": [...]}` or 400 `{"errors", "files"}`), and a write the disk cuts short
    leaves what was there (2026-12-06: it left the file truncated, half written)."""
    toolbox = f"{server.url}/api/toolbox/{sandbox.id}/files/bulk-upload"
    headers = {"Authorization": f"Bearer {KEY}"}
    good = requests.post(toolbox, headers=headers, timeout=30, files={"files[0].path": (None, "ok.txt"),
                                                                        "files[0].file": ("ok.txt", b"ok")})
    assert good.status_code == 200 and good.json() == {"files": [{"path": "ok.txt", "bytes": 2}]}, good.text
    mixed = requests.post(toolbox, headers=headers, timeout=30, files={"files[0].file": (None, b"x"),
                                                                         "files[1].path": (None, " spaced.txt "),
                                                                         "files[1].file": ("x", b"spaced")})
    assert mixed.status_code == 400, mixed.text
    assert mixed.json()["errors"] == ["file[0]: missing .path metadata"], mixed.text
    assert mixed.json()["files"] == [{"path": "spaced.txt", "bytes": 6}], mixed.text
    assert await sandbox.fs.download_file("spaced.txt") == b"spaced"
    await sandbox.fs.upload_file(b"old", "/tmp/kept.txt")
    filled = await sandbox.process.code_run(FILL_THE_DISK)
    assert filled.exit_code == 0, filled.result
    with pytest.raises(DaytonaError, match="space"):
        await sandbox.fs.upload_file(b"new " * 100_000, "/tmp/kept.txt")
    assert await sandbox.fs.download_file("/tmp/kept.txt") == b"old"
    assert not [f.name for f in await sandbox.fs.list_files("/tmp") if f.name.startswith(".verl-sf")]


async def test_another_key_sees_nothing_of_a_sandbox(server: ServerHandle, sandbox: AsyncSandbox) -> None:
    other = AsyncDaytona(DaytonaConfig(api_key=OTHER_KEY, api_url=f"{server.url}/api"))
    try:
        with pytest.raises(DaytonaNotFoundError, match="not found"):
            await other.get(sandbox.id)
        assert [s.id async for s in other.list()] == []
    finally:
        await other.close()
    headers = {"Authorization": f"Bearer {OTHER_KEY}"}
    for method, path in (("GET", f"/api/toolbox/{sandbox.id}/work-dir"), ("DELETE", f"/api/sandbox/{sandbox.id}"),
                         ("POST", f"/api/sandbox/{sandbox.id}/stop"),
                         ("POST", f"/api/toolbox/{sandbox.id}/process/execute")):
        answer = requests.request(method, server.url + path, headers=headers, json={"command": "id"}, timeout=30)
        assert answer.status_code == 404 and answer.json()["message"] == f"Sandbox with ID or name {sandbox.id} not found"
    assert (await sandbox.process.exec("echo still mine")).result == "still mine\n"


async def test_stop_start_and_calls_to_stopped_or_deleted_sandboxes(daytona: AsyncDaytona) -> None:
    box = await daytona.create()
    await box.code_interpreter.run_code("state = 1")
    await box.stop()
    assert box.state.value == "stopped"
    with pytest.raises(DaytonaConflictError, match="not started"):
        await box.process.exec("echo no")
    with pytest.raises(DaytonaError):
        await asyncio.wait_for(box.code_interpreter.run_code("print(1)"), 10)
    await box.start()
    assert box.state.value == "started"
    fresh = await box.code_interpreter.run_code("print('state' in globals())")
    assert fresh.stdout == "False\n"  # a stopped sandbox keeps nothing (docs/daytona.md)
    await box.delete()
    with pytest.raises(DaytonaNotFoundError):
        await box.process.exec("echo gone")
    with pytest.raises(DaytonaError):
        await asyncio.wait_for(box.code_interpreter.run_code("print(1)"), 10)


async def test_auto_stop_and_auto_delete_are_enforced(daytona: AsyncDaytona) -> None:
    box = await daytona.create(CreateSandboxFromSnapshotParams(auto_stop_interval=1, auto_delete_interval=1))
    await box.process.exec("true")

    async def state_is(wanted: str) -> bool:
        try:
            await box.refresh_data()
        except DaytonaNotFoundError:
            return wanted == "gone"
        return box.state.value == wanted
    await wait_until_async(lambda: state_is("stopped"), 5 * MINUTE_S, "auto-stop")
    await wait_until_async(lambda: state_is("gone"), 5 * MINUTE_S, "auto-delete")


async def test_concurrent_creations_are_each_made_or_refused(server: ServerHandle) -> None:
    capped = start_server("--slots", "2", "--preload", "", "--daytona-max-sandboxes", "6")
    client = AsyncDaytona(DaytonaConfig(api_key=KEY, api_url=f"{capped.url}/api"))
    try:
        results = await asyncio.gather(*(client.create(timeout=60) for _ in range(16)), return_exceptions=True)
        made = [r for r in results if isinstance(r, AsyncSandbox)]
        refused = [r for r in results if not isinstance(r, AsyncSandbox)]
        assert len(made) == 6 and len(refused) == 10
        assert all(isinstance(r, DaytonaError) and r.status_code == 503 for r in refused)
        assert len([s async for s in client.list()]) == 6
        outputs = await asyncio.gather(*(s.process.exec("echo ok") for s in made))
        assert [o.result for o in outputs] == ["ok\n"] * 6
        def sessions() -> int:
            return int(requests.get(f"{capped.url}/health", timeout=10).json()["sessions"])

        ready = 2  # --e2b-ready-sandboxes: two more boxes are started ahead once a create has asked
        wait_until(lambda: sessions() == 6 + ready, 30, "a session per sandbox, and the ready ones")
        await asyncio.gather(*(s.delete() for s in made))
        wait_until(lambda: sessions() == ready, 10, "the sessions of deleted sandboxes to end")
    finally:
        await client.close()
        stop_server(capped.process)


async def test_server_key_is_required_when_set() -> None:
    keyed = start_server("--slots", "1", "--preload", "", "--daytona-api-key", KEY)
    try:
        wrong = AsyncDaytona(DaytonaConfig(api_key="wrong", api_url=f"{keyed.url}/api"))
        right = AsyncDaytona(DaytonaConfig(api_key=KEY, api_url=f"{keyed.url}/api"))
        try:
            with pytest.raises(DaytonaError) as refused:
                await wrong.create()
            assert refused.value.status_code == 401
            box = await right.create()
            assert (await box.process.exec("echo in")).result == "in\n"
            await box.delete()
        finally:
            await wrong.close()
            await right.close()
        assert requests.post(f"{keyed.url}/api/sandbox", json={}, timeout=10).status_code == 401
    finally:
        stop_server(keyed.process)


def test_bad_input_names_the_field(server: ServerHandle) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{server.url}/api/sandbox"
    not_json = requests.post(url, data=b"{nope", headers={**headers, "Content-Type": "application/json"}, timeout=10)
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["message"]
    deep = requests.post(url, data=b"[" * 5000 + b"]" * 5000, timeout=10,
                         headers={**headers, "Content-Type": "application/json"})
    assert deep.status_code == 400 and "deeper than 100 levels" in deep.json()["message"], deep.text
    deep_labels = requests.get(url, params={"labels": "[" * 2000}, headers=headers, timeout=10)
    assert deep_labels.status_code == 400 and deep_labels.json()["message"].startswith("labels"), deep_labels.text
    for body, field in (({"labels": ["a"]}, "labels"), ({"cpu": "two"}, "cpu"), ({"autoStopInterval": -3},
                        "autoStopInterval"), ({"env": {"A": 1}}, "env.A"), ({"buildInfo": {"dockerfileContent": "RUN x"}},
                                                                             "buildInfo"),
                        ({"env": {"A=B": "1"}}, "env"), ({"labels": {"k": "v" * (1 << 20)}}, "labels"),
                        ({"name": "\x00" * 10}, "name"), ({"autoStopInterval": 10**26}, "autoStopInterval")):
        answer = requests.post(url, json=body, headers=headers, timeout=10)
        assert answer.status_code == 422 and answer.json()["message"].startswith(field), (body, answer.text)
    assert requests.post(url, json={}, timeout=10).status_code == 401
    missing = requests.get(f"{url}/no-such-box", headers=headers, timeout=10)
    assert missing.status_code == 404 and missing.json() == {
        "statusCode": 404, "message": "Sandbox with ID or name no-such-box not found", "error": "Not Found"}
    labels = requests.get(url, params={"labels": "{broken"}, headers=headers, timeout=10)
    assert labels.status_code == 400 and labels.json()["message"].startswith("labels")
    box = requests.post(url, json={}, headers=headers, timeout=30).json()
    try:
        execute = requests.post(f"{server.url}/api/toolbox/{box['id']}/process/execute", json={"cmd": "x"},
                                headers=headers, timeout=10)
        assert execute.status_code == 422 and execute.json()["message"].startswith("command")
        # Labels set later have creation's cap (red team, 2026-11-30: 50 MB taken, then listed whole).
        relabelled = requests.put(f"{url}/{box['id']}/labels", headers=headers, timeout=30,
                                  json={"labels": {f"k{i}": "v" * 1000 for i in range(100)}})
        assert relabelled.status_code == 422 and relabelled.json()["message"].startswith("labels"), relabelled.text
        for soon in ("soon", "9" * 26):
            interval = requests.post(f"{url}/{box['id']}/autostop/{soon}", headers=headers, timeout=10)
            assert interval.status_code == 400 and "interval" in interval.json()["message"], interval.text
        toolbox = f"{server.url}/api/toolbox/{box['id']}"
        for method, path, fields in (("GET", "/files/download", {"params": {"path": "a\x00b"}}),
                                     ("POST", "/files/bulk-upload", {"files": {"files[0].file": ("a\x00b", b"x")}}),
                                     ("POST", "/files/bulk-upload", {"files": {"files[0].path": (None, "a\x00b"),
                                                                               "files[0].file": ("f", b"x")}}),
                                     ("POST", "/process/execute", {"json": {"command": "echo a\x00b"}}),
                                     ("POST", "/process/execute", {"json": {"command": "pwd", "cwd": "a\x00b"}}),
                                     ("POST", "/process/code-run", {"json": {"code": "print(1)", "argv": ["a\x00"]}})):
            answer = requests.request(method, toolbox + path, headers=headers, timeout=30, **fields)
            assert answer.status_code == 400 and ("NUL" in answer.text or "null" in answer.text
                                                  or "malformed" in answer.text), (path, fields, answer.text)
        alive = requests.post(f"{toolbox}/process/execute", json={"command": "echo alive"}, headers=headers, timeout=30)
        assert alive.json()["result"] == "alive\n"
    finally:
        requests.delete(f"{url}/{box['id']}", headers=headers, timeout=10)


async def test_websocket_bad_request_and_a_client_that_leaves_mid_run(server: ServerHandle,
                                                                      sandbox: AsyncSandbox) -> None:
    url = f"{server.url.replace('http', 'ws')}/api/toolbox/{sandbox.id}/process/interpreter/execute"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url, headers=headers) as ws:
            await ws.send_str(json.dumps({"codes": "print(1)"}))
            closing = await ws.receive()
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 4400 and "code" in closing.extra
        async with http.ws_connect(url, headers=headers, max_msg_size=0) as ws:  # past aiohttp's default 4 MiB
            await ws.send_str(json.dumps({"code": "print(len('" + "y" * (5 << 20) + "'))"}))
            frames = [message.data async for message in ws if message.type == aiohttp.WSMsgType.TEXT]
            assert any(str(5 << 20) in frame for frame in frames), frames
        async with http.ws_connect(url, headers=headers) as ws:  # a second request mid-run: the first answers
            await ws.send_str(json.dumps({"code": "import time\ntime.sleep(0.5)\nprint('first')"}))
            await ws.send_str(json.dumps({"code": "print('second')"}))
            frames = [message.data async for message in ws if message.type == aiohttp.WSMsgType.TEXT]
            assert any("first" in frame for frame in frames) and not any("second" in f for f in frames), frames
        marker = f"ws-{uuid.uuid4().hex[:8]}"
        ws = await http.ws_connect(url, headers=headers)
        await ws.send_str(json.dumps({"code": f"import ctypes\nctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
                                              "import time\nfor i in range(300):\n    time.sleep(0.1)\n"
                                              "open('finished', 'w').write('yes')", "timeout": 60}))
        await wait_until_async(lambda: asyncio.to_thread(named, server, marker), 30, "the run has started")
        await ws.close()
    # The run was interrupted: the sandbox answers at once, and the run never finished.
    started = time.monotonic()
    after = await sandbox.code_interpreter.run_code("import os\nprint(os.path.exists('finished'), i < 299)")
    assert after.stdout == "False True\n" and time.monotonic() - started < 10


async def test_interrupts_work_when_the_server_was_started_ignoring_sigint() -> None:
    """`verl-sf serve &` from a script starts it with SIGINT ignored; a run's time-out must still interrupt it."""
    deaf = start_server("--slots", "1", "--preload", "", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    client = AsyncDaytona(DaytonaConfig(api_key=KEY, api_url=f"{deaf.url}/api"))
    try:
        box = await client.create()
        await box.code_interpreter.run_code("kept = 3")
        with pytest.raises(DaytonaTimeoutError):
            await box.code_interpreter.run_code("while True:\n    pass", timeout=1)
        after = await box.code_interpreter.run_code("print(kept)")
        assert after.stdout == "3\n" and after.error is None
    finally:
        await client.close()
        stop_server(deaf.process)


async def test_fronts_route_every_call_to_the_front_holding_the_sandbox() -> None:
    """Under --fronts 2 a sandbox lives in one front; calls that land on the other (a new connection
    lands on either) are relayed there: control plane, toolbox, the interpreter's websocket, names, lists."""
    fronts = start_server("--fronts", "2", "--slots", "4", "--preload", "")
    config = DaytonaConfig(api_key=KEY, api_url=f"{fronts.url}/api")

    async def fresh_client_call(call: Callable[[AsyncDaytona], Awaitable[Any]]) -> Any:
        client = AsyncDaytona(config)  # its own connections: the kernel spreads them over the fronts
        try:
            return await call(client)
        finally:
            await client.close()

    try:
        names = [f"front-{i}-{uuid.uuid4().hex[:6]}" for i in range(16)]
        created = await asyncio.gather(*(fresh_client_call(
            lambda c, n=name: c.create(CreateSandboxFromSnapshotParams(name=n, labels={"fronts": "yes"})))
            for name in names))
        ids = [box.id for box in created]
        assert {i.split("-", 1)[0] for i in ids} == {"f0", "f1"}

        async def use(client: AsyncDaytona, name: str) -> tuple[str, str, str]:
            box = await client.get(name)  # by name: every front is asked
            ran = await box.code_interpreter.run_code(f"print({name!r})")
            executed = await box.process.exec("echo shell")
            return box.id, ran.stdout, executed.result
        used = await asyncio.gather(*(fresh_client_call(lambda c, n=name: use(c, n)) for name in names))
        assert used == [(i, f"{n}\n", "shell\n") for i, n in zip(ids, names, strict=True)]
        listed = await fresh_client_call(lambda c: _collect(c.list(ListSandboxesQuery(labels={"fronts": "yes"},
                                                                                      limit=5))))
        assert sorted(s.id for s in listed) == sorted(ids)
        with pytest.raises(DaytonaConflictError, match="already exists"):
            await fresh_client_call(lambda c: c.create(CreateSandboxFromSnapshotParams(name=names[0])))
        await asyncio.gather(*(fresh_client_call(lambda c, i=i: c.get(i)) for i in ids))
        await asyncio.gather(*(fresh_client_call(lambda c, n=name: _delete(c, n)) for name in names))
        assert await fresh_client_call(lambda c: _collect(c.list())) == []
    finally:
        stop_server(fronts.process)


async def _collect(sandboxes: AsyncIterator[Any]) -> list[Any]:
    return [s async for s in sandboxes]


async def _delete(client: AsyncDaytona, name: str) -> None:
    await (await client.get(name)).delete()


async def test_sandboxes_see_nothing_of_each_other_nor_of_the_server(daytona: AsyncDaytona) -> None:
    first, second = await asyncio.gather(daytona.create(), daytona.create())
    try:
        await first.fs.upload_file(b"first's secret", "secret.txt")
        await first.process.create_session("bg")
        await first.process.execute_session_command("bg", SessionExecuteRequest(command="sleep 30", run_async=True))
        own = await first.process.exec("ps -eo args | grep -c '[s]leep 30'")
        assert int(own.result) >= 1  # the check below can see a sleeper
        home = await second.get_user_home_dir()
        with pytest.raises(DaytonaNotFoundError):
            await second.fs.download_file(f"{home}/secret.txt")  # the same path is its own, empty home
        seen = await second.process.exec("ls /proc | grep -c '^[0-9]'; ps -eo args | grep -c '[s]leep 30'")
        processes, sleepers = (int(n) for n in seen.result.split())
        assert processes < 10 and sleepers == 0  # its own few processes, none of the other sandbox's
        env = await second.code_interpreter.run_code("import os\nprint(sorted(os.environ))")
        assert "DAYTONA_API_KEY" not in env.stdout and "VERL_SF" not in env.stdout
        with pytest.raises(DaytonaError):
            await second.fs.download_file("/proc/1/environ")
        network = await second.code_interpreter.run_code(
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 1), timeout=2)\nexcept OSError as e:\n"
            "    print(type(e).__name__)")
        assert network.stdout.strip() in ("PermissionError", "ConnectionRefusedError", "OSError")
    finally:
        await asyncio.gather(first.delete(), second.delete())


async def test_interpreter_messages_count_as_request_bodies() -> None:
    """Red team, 2026-12-06: the interpreter websocket's messages were outside `--max-bodies-mb`:
    twenty 60 MB executions sleeping at once took the server from 0.6 to 4.2 GB.  A message is held
    as a body is until its answer is sent; past the cap the socket closes with 4503, retry later."""
    capped = start_server("--slots", "4", "--preload", "", "--max-body-mb", "16", "--max-bodies-mb", "40")
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        box = requests.post(f"{capped.url}/api/sandbox", json={}, headers=headers, timeout=60).json()
        url = f"{capped.url.replace('http', 'ws')}/api/toolbox/{box['id']}/process/interpreter/execute"
        code = "import time\ntime.sleep(4)\nprint('done')\n#" + "x" * (15 << 20)
        async with aiohttp.ClientSession() as http:
            async def execute() -> tuple[list[str], Any]:
                async with http.ws_connect(url, headers=headers, max_msg_size=0) as ws:
                    await ws.send_str(json.dumps({"code": code}))
                    frames = [message.data async for message in ws if message.type == aiohttp.WSMsgType.TEXT]
                    return frames, ws.close_code
            first = [asyncio.ensure_future(execute()) for _ in range(2)]
            await asyncio.sleep(2)  # both held, their code asleep
            _, refused = await execute()
            assert refused == 4503, refused
            done = await asyncio.gather(*first)
            assert all(any("done" in frame for frame in frames) for frames, _ in done), done
            again, closed = await execute()  # their answers sent: room again
            assert any("done" in frame for frame in again) and closed == 1000, (again, closed)
    finally:
        stop_server(capped.process)


async def test_the_interpreter_socket_takes_no_compressed_frames_and_refuses_a_bracket_bomb(server: ServerHandle) -> None:
    """Red team, 2026-12-07: a permessage-deflate frame of 204 KB inflating to 200 MiB was inflated on the
    event loop (runs waited up to 1.3 s), and a message's JSON was parsed there too.  The socket
    negotiates no compression, and ten million lists in 18 MiB are refused at the token cap."""
    headers = {"Authorization": f"Bearer {KEY}"}
    box = requests.post(f"{server.url}/api/sandbox", json={}, headers=headers, timeout=60).json()
    url = f"{server.url.replace('http', 'ws')}/api/toolbox/{box['id']}/process/interpreter/execute"
    bomb = "[" + ",".join(["[" * 99 + "]" * 99] * 99_000) + "]"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url, headers=headers, compress=15, max_msg_size=0) as ws:
                assert ws.compress == 0  # offered, not taken
                await ws.send_str(bomb)
                closing = await ws.receive(timeout=30)
                assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 4400, closing
                assert "more than 100,000 JSON tokens" in closing.extra, closing
            async with http.ws_connect(url, headers=headers) as ws:
                await ws.send_str(json.dumps({"code": "print('after')"}))
                frames = [message.data async for message in ws if message.type == aiohttp.WSMsgType.TEXT]
                assert any("after" in frame for frame in frames), frames
    finally:
        requests.delete(f"{server.url}/api/sandbox/{box['id']}", headers=headers, timeout=60)
