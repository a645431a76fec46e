"""Forks over HTTP on every rung a server may run: as root and as an ordinary account (the
namespaces rung: forks work, and a fork holds no capability, not even after an exec as uid 0),
and inside a container's profile (the landlock rung: 501 saying why)."""

from __future__ import annotations

import json

import pytest
import requests

from tests.server_fixtures import CONTAINER_MODES, SERVER_MODES, ServerHandle, server_in_mode

# Every capability set of the process, then of a program it execs.
CAPABILITIES = """
import json, os, subprocess
def sets(text):
    return [line.split()[1] for line in text.splitlines() if line.startswith(('CapInh', 'CapPrm', 'CapEff', 'CapAmb'))]
print(json.dumps({"uid": os.getuid(), "own": sets(open('/proc/self/status').read()),
                  "exec": sets(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)}))
"""
NONE = ["0000000000000000"] * 4


def post(server: ServerHandle, path: str, body: dict) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120)


def run(server: ServerHandle, session_id: str, code: str) -> str:
    response = post(server, "/run_code", {"code": code, "language": "python", "session_id": session_id})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "Success", response.json()
    return str(response.json()["run_result"]["stdout"])


@pytest.mark.parametrize("mode", SERVER_MODES)
def test_forks_on_the_namespaces_rung(mode: str) -> None:
    with server_in_mode(mode, "--preload", "") as server:
        parent = post(server, "/sessions", {"language": "python"}).json()["session_id"]
        run(server, parent, "x = 41")
        forked = post(server, f"/sessions/{parent}/fork", {"count": 2})
        assert forked.status_code == 201, forked.text
        first, second = forked.json()["session_ids"]
        held = json.loads(run(server, first, CAPABILITIES))
        assert held["own"] == NONE and held["exec"] == NONE, held  # uid 0 as an ordinary account: still none
        assert requests.delete(f"{server.url}/sessions/{parent}", timeout=30).status_code == 200
        assert run(server, second, "print(x + 1)") == "42\n"


@pytest.mark.parametrize("mode", CONTAINER_MODES)
def test_forks_are_501_on_the_landlock_rung(mode: str) -> None:
    with server_in_mode(mode, "--preload", "") as server:
        parent = post(server, "/sessions", {"language": "python"}).json()["session_id"]
        for path in (f"/sessions/{parent}/fork", f"/sessions/{parent}/snapshot"):
            refused = post(server, path, {})
            assert refused.status_code == 501, refused.text
            assert "namespaces isolation rung" in refused.text
        assert run(server, parent, "print('still here')") == "still here\n"
