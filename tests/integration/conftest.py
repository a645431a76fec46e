"""Real `verl-sf serve` processes on 127.0.0.1 for the reward tests."""

from __future__ import annotations

from typing import Iterator

import pytest
import requests

from tests.server_fixtures import ServerHandle, start_server, stop_server


@pytest.fixture(scope="module")
def reward_server() -> Iterator[ServerHandle]:
    """A small shared server (two sandbox slots) for the tests that only need verdicts."""
    handle = start_server("--workers", "2")
    yield handle
    stop_server(handle.process)


def runs_finished(server: ServerHandle) -> float:
    """Requests the server has finished, from its Prometheus counter (`verl_sf_runs_total`)."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("verl_sf_runs_total{"))
