"""Real `verl-sf serve` processes on 127.0.0.1 for tests (no in-process shortcuts)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from verl_sf.server.process import start_server_process, stop_server_process


@dataclasses.dataclass
class ServerHandle:
    url: str  # base URL, e.g. http://127.0.0.1:41234
    process: subprocess.Popen

    @property
    def run_code_url(self) -> str:
        return self.url + "/run_code"


def start_server(*extra_args: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> ServerHandle:
    """Start `verl-sf serve --port 0` and wait for its 'listening on' line."""
    proc, url = start_server_process(*extra_args, env=env, timeout=timeout)
    return ServerHandle(url, proc)


def stop_server(proc: subprocess.Popen) -> None:
    stop_server_process(proc)


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


def runs_finished(server: ServerHandle) -> float:
    """Requests the server has finished, from its Prometheus counter (`verl_sf_runs_total`)."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("verl_sf_runs_total{"))


def run_code_batch(server: ServerHandle, cases: dict[str, tuple[str, str, dict[str, Any]]]) -> dict[str, dict]:
    """POST every case (key -> (code, language, fields)) at once; the server queues them, so
    slow start-ups (JVMs) and sleeps overlap instead of adding up."""
    with ThreadPoolExecutor(8) as pool:
        futures = {key: pool.submit(run_code, server, code, language=language, **fields)
                   for key, (code, language, fields) in cases.items()}
        return {key: future.result() for key, future in futures.items()}
