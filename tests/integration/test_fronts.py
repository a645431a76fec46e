"""`verl-sf serve --fronts N`: N real server processes on one port (SO_REUSEPORT).

Every request here opens a fresh connection, so the kernel spreads them over the fronts; /health
names the front that answered.  Session calls must reach the front that owns the session
whichever front they land on (the session API is the server's own: POST /sessions,
`session_id` in /run_code, GET/DELETE /sessions/{id}).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.server_fixtures import ServerHandle, start_server, stop_server
from tests.waiting import wait_until

FRONTS = 2


@pytest.fixture(scope="module")
def fronts_server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "3", "--max-in-flight", "10", "--max-body-mb", "1", "--fronts", str(FRONTS), "--list-snapshots")
    yield handle
    stop_server(handle.process)


def fresh(method: str, url: str, **kwargs) -> requests.Response:
    """One request on a new connection (no keep-alive pool): the kernel picks the front."""
    with requests.Session() as session:
        return session.request(method, url, timeout=60, **kwargs)


def front_processes(pid: int) -> list[int]:
    """The children of the server's parent process that are fronts (spawned interpreters)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if parent == pid and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_health_sums_the_fronts_and_both_answer(fronts_server: ServerHandle) -> None:
    answers = [fresh("GET", fronts_server.url + "/health").json() for _ in range(24)]
    assert {a["front"] for a in answers} == set(range(FRONTS)), "the kernel spread connections over both fronts"
    for health in answers:
        assert health["status"] == "ok"
        assert health["fronts"] == FRONTS
        assert health["slots"] == 3, "the slots are shared out, not multiplied"
        assert health["max_in_flight"] == 10


def test_runs_on_every_front(fronts_server: ServerHandle) -> None:
    for i in range(8):
        answer = fresh("POST", fronts_server.run_code_url, json={"code": f"print({i} * 2)", "language": "python"})
        assert answer.status_code == 200
        assert answer.json()["run_result"]["stdout"] == f"{i * 2}\n"


def test_oversized_body_is_a_413_in_the_servers_shape(fronts_server: ServerHandle) -> None:
    big = "x" * (2 << 20)
    answer = fresh("POST", fronts_server.run_code_url, json={"code": big, "language": "python", "session_id": "f0-x"})
    assert answer.status_code == 413
    assert "larger than" in answer.json()["detail"]


def test_foreign_session_id_is_a_404_naming_it(fronts_server: ServerHandle) -> None:
    answer = fresh("POST", fronts_server.run_code_url,
                   json={"code": "print(1)", "language": "python", "session_id": "not-ours"})
    assert answer.status_code == 404
    assert "not-ours" in answer.json()["detail"]


def test_session_calls_reach_their_owner_from_any_front(fronts_server: ServerHandle) -> None:
    created = fresh("POST", fronts_server.url + "/sessions", json={"language": "python"})
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    assert session_id.startswith("f"), "the id names its owning front"
    fresh("POST", fronts_server.run_code_url, json={"code": "x = 0", "language": "python",
                                                    "session_id": session_id}).raise_for_status()
    outputs = []
    for _ in range(8):  # fresh connections: about half land on the other front and are forwarded
        answer = fresh("POST", fronts_server.run_code_url,
                       json={"code": "x += 1\nprint(x)", "language": "python", "session_id": session_id})
        assert answer.status_code == 200, answer.text
        assert answer.json().get("session_id") == session_id
        outputs.append(answer.json()["run_result"]["stdout"])
    assert outputs == [f"{i}\n" for i in range(1, 9)]
    assert fresh("GET", f"{fronts_server.url}/sessions/{session_id}").status_code == 200
    assert fresh("DELETE", f"{fronts_server.url}/sessions/{session_id}").status_code == 200
    assert fresh("GET", f"{fronts_server.url}/sessions/{session_id}").status_code == 404


def test_forks_and_snapshots_reach_their_owner_from_any_front(fronts_server: ServerHandle) -> None:
    """A session's forks and snapshots are its front's, named for it; a snapshot routes like a session."""
    url = fronts_server.url
    parent = fresh("POST", url + "/sessions", json={"language": "python"}).json()["session_id"]
    fresh("POST", fronts_server.run_code_url, json={"code": "x = 41", "language": "python",
                                                    "session_id": parent}).raise_for_status()
    owner = parent.split("-")[0]
    forked = fresh("POST", f"{url}/sessions/{parent}/fork", json={"count": 2})
    assert forked.status_code == 201, forked.text
    forks = forked.json()["session_ids"]
    snapshot = fresh("POST", f"{url}/sessions/{parent}/snapshot")
    assert snapshot.status_code == 201, snapshot.text
    snapshot_id = snapshot.json()["snapshot_id"]
    assert {i.split("-")[0] for i in [*forks, snapshot_id]} == {owner}, "named for the parent's front"
    started = []
    for _ in range(4):  # fresh connections: some land on the other front and are forwarded to the owner
        answer = fresh("POST", url + "/sessions", json={"from_snapshot": snapshot_id})
        assert answer.status_code == 201, answer.text
        started.append(answer.json()["session_id"])
    for session_id in [*forks, *started]:
        answer = fresh("POST", fronts_server.run_code_url, json={"code": "x += 1\nprint(x)", "language": "python",
                                                                 "session_id": session_id})
        assert answer.status_code == 200 and answer.json()["run_result"]["stdout"] == "42\n", answer.text
    for _ in range(4):  # whichever front answers lists every front's snapshots, under their public ids
        listed = fresh("GET", url + "/snapshots").json()["snapshots"]
        assert [s["sessions_started"] for s in listed if s["snapshot_id"] == snapshot_id] == [4]
    assert fresh("GET", url + "/health").json()["snapshots"] == len(listed)
    assert fresh("GET", f"{url}/snapshots/{snapshot_id}").json()["snapshot_id"] == snapshot_id
    assert fresh("DELETE", f"{url}/snapshots/{snapshot_id}").json() == {"snapshot_id": snapshot_id, "deleted": True}
    gone = fresh("POST", url + "/sessions", json={"from_snapshot": snapshot_id})
    assert gone.status_code == 404 and "deleted" in gone.json()["detail"], gone.text
    foreign = fresh("GET", url + "/snapshots/not-ours")
    assert foreign.status_code == 404 and "unknown snapshot 'not-ours'" in foreign.json()["detail"]
    for session_id in [parent, *forks, *started]:
        fresh("DELETE", f"{url}/sessions/{session_id}")


def test_a_front_dying_stops_the_server() -> None:
    """No half-server: the parent stops the other fronts and exits non-zero for its supervisor to restart."""
    handle = start_server("--slots", "2", "--fronts", "2")
    try:
        fronts = front_processes(handle.process.pid)
        assert len(fronts) == 2
        os.kill(fronts[0], signal.SIGKILL)
        assert handle.process.wait(timeout=60) == 1
        assert [pid for pid in fronts if running(pid)] == []
    finally:
        stop_server(handle.process)


def test_a_killed_parent_takes_its_fronts_along() -> None:
    """SIGKILL of the parent (no cleanup code runs): the fronts still go, so nothing keeps the port."""
    handle = start_server("--slots", "2", "--fronts", "2")
    fronts = front_processes(handle.process.pid)
    assert len(fronts) == 2
    os.kill(handle.process.pid, signal.SIGKILL)
    handle.process.wait()
    wait_until(lambda: [pid for pid in fronts if running(pid)] == [], 60, "every front is gone", every=0.5)


def test_more_fronts_than_slots_is_refused() -> None:
    with pytest.raises(RuntimeError, match="exited"):
        start_server("--slots", "1", "--fronts", "2")
