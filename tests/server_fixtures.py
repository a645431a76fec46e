"""Real `verl-sf serve` processes on 127.0.0.1 for tests (no in-process shortcuts)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest
import requests

LISTEN_RE = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


@dataclasses.dataclass
class ServerHandle:
    url: str  # base URL, e.g. http://127.0.0.1:41234
    process: subprocess.Popen

    @property
    def run_code_url(self) -> str:
        return self.url + "/run_code"


def start_server(*extra_args: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> ServerHandle:
    """Start `verl-sf serve --port 0` and wait for its 'listening on' line."""
    cmd = [sys.executable, "-m", "verl_sf.cli", "serve", "--host", "127.0.0.1", "--port", "0", *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env or os.environ.copy(),
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"verl-sf serve exited with {proc.wait()} before listening")
        match = LISTEN_RE.search(line)
        if match:
            return ServerHandle(match.group(1), proc)
    stop_server(proc)
    raise RuntimeError("verl-sf serve did not start in time")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# The shared server holds this in its environment, as a real one would hold an API key.
SERVER_SECRET = "verl-sf-test-secret-7f3a9c"


@pytest.fixture(scope="session")
def sf_server() -> Iterator[ServerHandle]:
    """One shared server for the whole session, default (isolated) configuration."""
    handle = start_server(env={**os.environ, "VERL_SF_TEST_SECRET": SERVER_SECRET})
    yield handle
    stop_server(handle.process)


def run_code(server: ServerHandle, code: str, language: str = "python", **fields) -> dict:
    """POST /run_code and return the JSON answer (asserting HTTP 200)."""
    response = requests.post(server.run_code_url, json={"code": code, "language": language, **fields}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()
