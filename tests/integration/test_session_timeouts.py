"""A session call that reaches its time-out is interrupted and its session lives: on a default
`verl-sf serve` started as a shell starts a background job (SIGINT and SIGQUIT ignored, inherited),
through HTTP, for python and bash sessions, verl-tool trajectories and E2B contexts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

from tests.server_fixtures import SERVER_MODES, ServerHandle, server_in_mode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=[*SERVER_MODES, "root-container"] if os.geteuid() == 0 else SERVER_MODES)
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with server_in_mode(request.param, background_job=True) as handle:
        yield handle


def post(server: ServerHandle, path: str, **body: object) -> dict:
    response = requests.post(server.url + path, json=body, timeout=60)
    assert response.status_code in (200, 201), response.text
    return response.json()


def survives_its_time_out(server: ServerHandle, language: str, setup: str, sleep: str, check: str) -> str:
    sid = post(server, "/sessions", language=language)["session_id"]
    post(server, "/run_code", code=setup, language=language, session_id=sid)
    body = post(server, "/run_code", code=sleep, language=language, session_id=sid, run_timeout=2)
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded", body
    assert body["session_alive"] is True and "the session lives on" in body["message"], body
    after = post(server, "/run_code", code=check, language=language, session_id=sid)
    requests.delete(f"{server.url}/sessions/{sid}", timeout=30)
    return after["run_result"]["stdout"]


@pytest.mark.parametrize("sessions", [1, 4])
def test_python_sessions_survive_their_time_outs(server: ServerHandle, sessions: int) -> None:
    with ThreadPoolExecutor(sessions) as pool:
        outputs = list(pool.map(lambda _: survives_its_time_out(server, "python", "x = 5", "import time; time.sleep(30)",
                                                                "print(x)"), range(sessions)))
    assert outputs == ["5\n"] * sessions


def test_a_bash_session_survives_its_time_out(server: ServerHandle) -> None:
    assert survives_its_time_out(server, "bash", "X=5", "sleep 30", "echo $X") == "5\n"


def test_a_session_that_ignores_the_interrupt_is_killed_and_told_why(server: ServerHandle) -> None:
    sid = post(server, "/sessions", language="python")["session_id"]
    body = post(server, "/run_code", language="python", session_id=sid, run_timeout=1,
                code="import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)")
    assert body["session_alive"] is False
    assert "ignored the interrupt at its time-out for 2 s of its own time: the code ignores SIGINT" in body["message"]


def test_a_verl_tool_trajectory_survives_its_time_out(server: ServerHandle) -> None:
    def turn(action: str) -> str:
        body = post(server, "/get_observation", trajectory_ids=["t-timeout"], actions=[action])
        return body["observations"][0]

    turn("<python>kept = 'still here'</python>")
    assert "timed out" in turn("<python>import time\ntime.sleep(30)</python>")
    assert "still here" in turn("<python>print(kept)</python>")
    post(server, "/get_observation", trajectory_ids=["t-timeout"], actions=[""], finish=[True])


def test_an_e2b_context_survives_its_time_out(server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.setenv(name, server.url)
    monkeypatch.setenv("E2B_API_KEY", "e2b-any-key")
    sandbox = Sandbox.create(timeout=60)
    try:
        sandbox.run_code("x = 5")
        with pytest.raises(TimeoutException):  # the SDK's deadline (~4 s here), long before the cell's end
            sandbox.run_code("import time; time.sleep(12)", timeout=2)
        assert sandbox.run_code("x").text == "5"
    finally:
        sandbox.kill()
