"""The fork and snapshot routes over real HTTP: what each answers, and every bad input's typed refusal.

A real `verl-sf serve` on 127.0.0.1; the forks' own semantics (state, isolation, random generators)
are tests/integration/test_forks.py's.  Here: the routes, their bodies and status codes, the 404
reasons, 409 for a session in a call, 422 naming the field, the Prometheus rejection reasons and
/health's snapshot count.
"""

from __future__ import annotations

import concurrent.futures
import os
import resource
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.server_fixtures import (
    SERVER_MODES,
    SERVER_SECRET,
    ServerHandle,
    ci_account,
    server_in_mode,
    start_server,
    start_server_as_user,
    stop_server,
)
from tests.waiting import wait_until
from verl_sf.models import MAX_FORK_COUNT

MAX_SESSIONS = 40
LIVE: list[str] = []
"""Sessions a test made (forks included), ended after it: a later test's forks need room under the cap."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "", "--list-snapshots", "--max-sessions", str(MAX_SESSIONS),
                          env={**os.environ, "VERL_SF_TEST_SECRET": SERVER_SECRET})
    yield handle
    stop_server(handle.process)


@pytest.fixture(autouse=True)
def end_sessions(server: ServerHandle) -> Iterator[None]:
    yield
    for session_id in LIVE:
        requests.delete(f"{server.url}/sessions/{session_id}", timeout=30)
    LIVE.clear()


def post(server: ServerHandle, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120, **kwargs)


def create(server: ServerHandle, **fields: Any) -> str:
    response = post(server, "/sessions", fields if "from_snapshot" in fields else {"language": "python", **fields})
    assert response.status_code == 201, response.text
    LIVE.append(response.json()["session_id"])
    return LIVE[-1]


def fork(server: ServerHandle, parent: str, body: Any) -> requests.Response:
    response = post(server, f"/sessions/{parent}/fork", body)
    if response.status_code == 201:
        LIVE.extend(response.json()["session_ids"])
    return response


def run(server: ServerHandle, session_id: str, code: str, language: str = "python") -> str:
    response = post(server, "/run_code", {"code": code, "language": language, "session_id": session_id})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "Success", body
    return str(body["run_result"]["stdout"])


def detail_fields(response: requests.Response) -> list[list[str]]:
    return [entry["loc"] for entry in response.json()["detail"]]


def rejections(server: ServerHandle) -> dict[str, float]:
    text = requests.get(server.url + "/metrics", timeout=30).text
    return {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("verl_sf_rejections_total{")}


# ---- what the routes answer -------------------------------------------------------------------
def test_fork_answers_201_with_session_ids_that_hold_the_parents_state(server: ServerHandle) -> None:
    parent = create(server)
    run(server, parent, "x = 41")
    response = fork(server, parent, {"count": 2})
    assert response.status_code == 201, response.text
    forks = response.json()["session_ids"]
    assert len(set(forks)) == 2 and parent not in forks
    assert [run(server, copy, "x += 1\nprint(x)") for copy in forks] == ["42\n", "42\n"]
    assert run(server, parent, "print(x)") == "41\n"
    info = requests.get(f"{server.url}/sessions/{forks[0]}", timeout=30).json()
    assert info["alive"] is True and info["language"] == "python"


def test_an_empty_fork_body_asks_for_one_fork(server: ServerHandle) -> None:
    parent = create(server)
    run(server, parent, "y = 'kept'")
    for body in ({}, None):
        response = fork(server, parent, body)
        assert response.status_code == 201, response.text
        [copy] = response.json()["session_ids"]
        assert run(server, copy, "print(y)") == "kept\n"


def test_a_snapshot_is_listed_started_from_and_deleted(server: ServerHandle) -> None:
    source = create(server)
    run(server, source, "import os\nz = os.getpid() * 0 + 7\nopen('state.txt', 'w').write('on disk')")
    response = post(server, f"/sessions/{source}/snapshot")
    assert response.status_code == 201, response.text
    snapshot = response.json()
    assert snapshot["language"] == "python" and "source_session_id" not in snapshot  # the parent stays unnamed
    assert snapshot["expires_at"] > snapshot["created_at"] and snapshot["sessions_started"] == 0
    snapshot_id = snapshot["snapshot_id"]
    started = [create(server, from_snapshot=snapshot_id) for _ in range(2)]
    assert [run(server, s, "print(z, open('state.txt').read())") for s in started] == ["7 on disk\n"] * 2
    listed = {s["snapshot_id"]: s for s in requests.get(server.url + "/snapshots", timeout=30).json()["snapshots"]}
    assert listed[snapshot_id]["sessions_started"] == 2
    one = requests.get(f"{server.url}/snapshots/{snapshot_id}", timeout=30)
    assert one.status_code == 200 and one.json()["sessions_started"] == 2
    assert requests.get(server.url + "/health", timeout=30).json()["snapshots"] == len(listed)
    deleted = requests.delete(f"{server.url}/snapshots/{snapshot_id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {"snapshot_id": snapshot_id, "deleted": True}
    assert snapshot_id not in {s["snapshot_id"] for s in
                               requests.get(server.url + "/snapshots", timeout=30).json()["snapshots"]}
    assert run(server, started[0], "print(z)") == "7\n", "sessions started from a snapshot outlive it"


def test_a_group_starts_from_one_snapshot_at_once(server: ServerHandle) -> None:
    """What shared set-up does: n sessions started from one snapshot concurrently, none refused."""
    source = create(server)
    run(server, source, "group = 'set up'")
    snapshot_id = post(server, f"/sessions/{source}/snapshot").json()["snapshot_id"]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: post(server, "/sessions", {"from_snapshot": snapshot_id}), range(6)))
    assert [a.status_code for a in answers] == [201] * 6, [a.text for a in answers]
    LIVE.extend(a.json()["session_id"] for a in answers)
    assert {run(server, a.json()["session_id"], "print(group)") for a in answers} == {"set up\n"}
    requests.delete(f"{server.url}/snapshots/{snapshot_id}", timeout=30)


# ---- bad input: typed refusals ----------------------------------------------------------------
def test_unknown_sessions_and_snapshots_are_404_with_the_reason(server: ServerHandle) -> None:
    before = rejections(server)
    for path in ("/sessions/no-such-session/fork", "/sessions/no-such-session/snapshot"):
        response = post(server, path, {})
        assert response.status_code == 404, response.text
        assert "no-such-session" in response.json()["detail"] and "not found" in response.json()["detail"]
        assert response.json()["code"] == "session_not_found"  # errors.ANSWERS, machine-readable
    ended = create(server)
    requests.delete(f"{server.url}/sessions/{ended}", timeout=30)
    response = fork(server, ended, {"count": 1})
    assert response.status_code == 404 and "ended by DELETE" in response.json()["detail"], response.text
    for response in (requests.get(server.url + "/snapshots/no-such-snapshot", timeout=30),
                     requests.delete(server.url + "/snapshots/no-such-snapshot", timeout=30),
                     post(server, "/sessions", {"from_snapshot": "no-such-snapshot"})):
        assert response.status_code == 404, response.text
        assert "snapshot 'no-such-snapshot' not found" in response.json()["detail"]
        assert response.json()["code"] == "snapshot_not_found"
    after = rejections(server)
    assert after.get("session_not_found", 0) - before.get("session_not_found", 0) == 3
    assert after.get("snapshot_not_found", 0) - before.get("snapshot_not_found", 0) == 3


def test_a_huge_unknown_id_is_not_echoed_in_full(server: ServerHandle) -> None:
    huge = "s" * 900_000
    for response in (post(server, "/sessions", {"from_snapshot": huge}), post(server, "/run_code",
                     {"code": "1", "language": "python", "session_id": huge})):
        assert response.status_code == 404, response.text[:300]
        assert len(response.content) < 1000 and "(900000 characters)" in response.text, response.text[:300]


def test_a_deleted_snapshot_is_404_saying_so(server: ServerHandle) -> None:
    source = create(server)
    snapshot_id = post(server, f"/sessions/{source}/snapshot").json()["snapshot_id"]
    assert requests.delete(f"{server.url}/snapshots/{snapshot_id}", timeout=30).status_code == 200
    again = requests.delete(f"{server.url}/snapshots/{snapshot_id}", timeout=30)
    start = post(server, "/sessions", {"from_snapshot": snapshot_id})
    for response in (again, start):
        assert response.status_code == 404 and "deleted" in response.json()["detail"], response.text


@pytest.mark.parametrize("count", [0, -1, MAX_FORK_COUNT + 1, 10000, True, 2.0, "2"])
def test_a_count_out_of_range_or_not_an_integer_is_422_naming_count(server: ServerHandle, count: object) -> None:
    parent = create(server)
    response = fork(server, parent, {"count": count})
    assert response.status_code == 422 and detail_fields(response) == [["body", "count"]], response.text
    assert requests.get(f"{server.url}/sessions/{parent}", timeout=30).json()["alive"] is True


def test_a_count_past_the_servers_session_cap_is_422_naming_count(server: ServerHandle) -> None:
    parent = create(server)
    response = fork(server, parent, {"count": MAX_SESSIONS + 1})
    assert response.status_code == 422 and detail_fields(response) == [["body", "count"]], response.text
    assert "--max-sessions" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("body,field", [({"count": "two"}, "count"), ({"reseed": "maybe"}, "reseed"),
                                        ({"idle_ttl_s": 0}, "idle_ttl_s"), ({"copies": 2}, "copies")])
def test_a_malformed_fork_body_is_422_naming_the_field(server: ServerHandle, body: dict, field: str) -> None:
    parent = create(server)
    response = fork(server, parent, body)
    assert response.status_code == 422 and detail_fields(response) == [["body", field]], response.text


def test_a_fork_body_that_is_not_a_json_object_is_refused(server: ServerHandle) -> None:
    parent = create(server)
    not_json = requests.post(f"{server.url}/sessions/{parent}/fork", data=b"{count: 2", timeout=30,
                             headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["detail"]
    a_list = fork(server, parent, [1, 2])
    assert a_list.status_code == 422 and detail_fields(a_list) == [["body"]]


def test_from_snapshot_with_a_clashing_field_is_422_naming_it(server: ServerHandle) -> None:
    source = create(server)
    snapshot_id = post(server, f"/sessions/{source}/snapshot").json()["snapshot_id"]
    for body, field in (({"language": "bash"}, "language"), ({"files": {"a.txt": "eA=="}}, "files")):
        response = post(server, "/sessions", {"from_snapshot": snapshot_id, **body})
        assert response.status_code == 422 and detail_fields(response) == [["body", field]], response.text
    # Naming the snapshot's own language (or no files) is no clash.
    same = post(server, "/sessions", {"from_snapshot": snapshot_id, "language": "python", "files": {}})
    assert same.status_code == 201, same.text
    LIVE.append(same.json()["session_id"])
    unknown = post(server, "/sessions", {"from_snapshot": snapshot_id, "snapshot": "x"})
    assert unknown.status_code == 422 and detail_fields(unknown) == [["body", "snapshot"]]


def test_a_session_in_a_call_is_409_for_fork_and_snapshot(server: ServerHandle) -> None:
    busy = create(server)
    before = rejections(server).get("session_busy", 0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        long_call = pool.submit(run, server, busy, "import time\ntime.sleep(4)\nprint('finished')")
        wait_until(lambda: requests.get(server.url + "/health", timeout=30).json()["in_flight"] > 0, 60,
                   "the long call started")
        forked = fork(server, busy, {"count": 2})
        snapshot = post(server, f"/sessions/{busy}/snapshot")
        assert long_call.result() == "finished\n"
    for response in (forked, snapshot):
        assert response.status_code == 409, response.text
        assert busy in response.json()["detail"] and "call is running" in response.json()["detail"]
        assert response.json()["code"] == "session_busy" and response.json()["reason"].startswith("a call is running")
    assert rejections(server).get("session_busy", 0) - before == 2
    assert requests.get(server.url + "/health", timeout=30).json()["sessions"] <= MAX_SESSIONS
    after = fork(server, busy, {})
    assert after.status_code == 201, "once the call has finished the session forks"


def until_started(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A run's answer once the account has room again: ended sessions' processes are reaped after their reply."""
    def started() -> dict[str, Any] | None:
        answer: dict[str, Any] = requests.post(url + "/run_code", json=body, timeout=60).json()
        return None if "process limit" in str(answer.get("message")) else answer

    return wait_until(started, 20, "a run started once the sessions were ended", every=0.2)


def test_forks_past_the_sessions_process_limit_are_503_and_leave_nothing() -> None:
    """As an ordinary account a run's process cap is RLIMIT_NPROC, which a session's forks share: a fork
    that meets it is capacity (503 + Retry-After, naming the limit), never a 500, and all or none."""
    with server_in_mode("non-root", "--slots", "2", "--preload", "", "--max-processes", "24") as handle:
        def sessions() -> int:
            return int(requests.get(handle.url + "/health", timeout=30).json()["sessions"])

        created = requests.post(handle.url + "/sessions", json={"language": "python"}, timeout=60)
        assert created.status_code == 201, created.text
        parent = created.json()["session_id"]
        response = requests.post(f"{handle.url}/sessions/{parent}/fork", json={"count": 40}, timeout=120)
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] and response.json()["code"] == "overloaded"
        assert "process limit" in response.json()["detail"]
        assert sessions() == 1
        one = requests.post(f"{handle.url}/sessions/{parent}/fork", json={"count": 1}, timeout=120)
        assert one.status_code == 201, one.text
        [copy] = one.json()["session_ids"]
        answer = requests.post(handle.url + "/run_code", json={"code": "print(7)", "language": "python",
                                                               "session_id": copy}, timeout=60).json()
        assert answer["run_result"]["stdout"] == "7\n", answer


def _tasks_of(uid: int) -> int:
    """The processes and threads of an account on the machine: what its RLIMIT_NPROC counts."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return count


def test_a_program_the_accounts_process_limit_keeps_from_starting_is_a_sandbox_error() -> None:
    """Each run counts its processes in a user namespace of its own, and every one of them against the
    account's RLIMIT_NPROC too (here the server's, lowered): sessions until the account is at it, then a
    program that cannot be started did not fail (SandboxError naming the limit) and a session cannot
    start (503 + Retry-After), until sessions end."""
    uid = ci_account().pw_uid if os.geteuid() == 0 else os.getuid()
    room = _tasks_of(uid) + 100
    handle, home = start_server_as_user("--slots", "2", "--preload", "", preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_NPROC, (room, room)))
    try:
        bash = {"code": "echo hi", "language": "bash", "run_timeout": 5}
        held = []
        for _ in range(60):
            refused = requests.post(handle.url + "/run_code", json=bash, timeout=60).json()
            if refused["status"] != "Success":
                break
            more = requests.post(handle.url + "/sessions", json={"language": "python"}, timeout=60)
            assert more.status_code in (201, 503), more.text
            held += [more.json()["session_id"]] if more.status_code == 201 else []
        assert refused["status"] == "SandboxError" and "process limit" in refused["message"], (refused["run_result"]["stderr"], refused["run_result"]["stdout"])
        # A run is killed before its reply and reaped after it, and a bash run needs more processes than a
        # session: the account may still have room for a session or two, never for many.
        for _ in range(4):
            more = requests.post(handle.url + "/sessions", json={"language": "python"}, timeout=60)
            if more.status_code != 201:
                break
            held.append(more.json()["session_id"])
        assert more.status_code == 503 and more.headers["Retry-After"], more.text
        assert "process limit" in more.json()["detail"]
        for session_id in held:
            requests.delete(f"{handle.url}/sessions/{session_id}", timeout=30)
        ran = until_started(handle.url, bash)
        assert ran["status"] == "Success" and ran["run_result"]["stdout"] == "hi\n", ran
    finally:
        stop_server(handle.process)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("mode", SERVER_MODES)
def test_forks_whose_files_would_pass_the_memory_cap_are_503_before_any_copy(mode: str) -> None:
    """Each copy gets its own copy of the session's files: count x files past what is left of the cap over
    all runs and sessions is refused at once (503 naming --runs-memory-mb), the parent left as it was."""
    with server_in_mode(mode, "--slots", "2", "--preload", "", "--runs-memory-mb", "600") as handle:
        created = requests.post(handle.url + "/sessions", json={"language": "python", "memory_limit_MB": 256},
                                timeout=60)
        assert created.status_code == 201, created.text
        parent = created.json()["session_id"]
        write = "open('/workdir/big', 'wb').write(b'f' * (100 << 20)); x = 5"
        answer = requests.post(handle.url + "/run_code", json={"code": write, "language": "python",
                                                               "session_id": parent}, timeout=60).json()
        assert answer["status"] == "Success", answer
        response = requests.post(f"{handle.url}/sessions/{parent}/fork", json={"count": 8}, timeout=120)
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] and "--runs-memory-mb" in response.json()["detail"]
        assert requests.get(handle.url + "/health", timeout=30).json()["sessions"] == 1
        one = requests.post(f"{handle.url}/sessions/{parent}/fork", json={"count": 1}, timeout=120)
        assert one.status_code == 201, one.text
        for session_id in (parent, *one.json()["session_ids"]):
            answer = requests.post(handle.url + "/run_code", json={"code": "print(x)", "language": "python",
                                                                   "session_id": session_id}, timeout=60).json()
            assert answer["run_result"]["stdout"] == "5\n", answer


def test_concurrent_forks_of_one_session_are_409_naming_the_fork_not_a_call(server: ServerHandle) -> None:
    parent = create(server)
    run(server, parent, "x = 1")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: fork(server, parent, {"count": 2}), range(6)))
    refused = [a for a in answers if a.status_code == 409]
    assert any(a.status_code == 201 for a in answers), [a.text for a in answers]
    assert all(a.status_code in (201, 409) for a in answers), [a.text for a in answers]
    assert all("another fork or snapshot" in a.json()["detail"] for a in refused), [a.text for a in refused]


@pytest.mark.parametrize("reseed", ["yes", 0, 1, "true"])
def test_reseed_takes_a_json_boolean_only(server: ServerHandle, reseed: object) -> None:
    parent = create(server)
    response = fork(server, parent, {"count": 1, "reseed": reseed})
    assert response.status_code == 422 and ["body", "reseed"] in detail_fields(response), response.text


def test_a_session_that_closed_its_stdout_is_409_naming_it(server: ServerHandle) -> None:
    parent = create(server)
    run(server, parent, "import os\nos.close(1)")
    response = fork(server, parent, {"count": 1})
    assert response.status_code == 409 and "closed its stdout" in response.json()["detail"], response.text
    assert "/proc/" not in response.text


def test_a_chain_of_forks_nests_eight_deep_and_the_refusal_names_the_domains(server: ServerHandle) -> None:
    """Each fork puts its parent in one more Landlock domain, and a copy starts one deeper than its
    parent: copy k holds 2k, and Linux stacks 16 (docs/sessions.md, "How often")."""
    session = create(server)
    run(server, session, "depth = 0")
    for depth in range(1, 9):
        response = fork(server, session, {"count": 1})
        assert response.status_code == 201, (depth, response.text)
        session = response.json()["session_ids"][0]
        assert run(server, session, "depth += 1\nprint(depth)") == f"{depth}\n"
    refused = fork(server, session, {"count": 1})
    assert refused.status_code == 409, refused.text
    assert "it is in 16 Landlock domains" in refused.json()["detail"], refused.text


def test_a_child_that_exited_unreaped_does_not_block_a_fork(server: ServerHandle) -> None:
    """A zombie runs nothing, so it is not a background process; the parent reaps it after, the copy
    never had it (fork(2) copies no children)."""
    parent = create(server)
    run(server, parent, "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
                        "while open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':\n"
                        "    time.sleep(0.01)")
    response = fork(server, parent, {"count": 1})
    assert response.status_code == 201, response.text
    assert run(server, parent, "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))") == "7\n"
    copy = response.json()["session_ids"][0]
    assert run(server, copy, "try:\n    os.waitpid(pid, 0)\nexcept ChildProcessError:\n    print('none')") == "none\n"
    alive = post(server, "/run_code", {"code": "import subprocess, time\np = subprocess.Popen(['sleep', '30'])",
                                       "language": "python", "session_id": parent})
    assert alive.status_code == 200
    busy = fork(server, parent, {"count": 1})
    assert busy.status_code == 409 and "1 background process" in busy.json()["detail"], busy.text
