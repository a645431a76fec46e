"""Real `verl-sf serve` processes on 127.0.0.1 for the reward tests."""

from __future__ import annotations

from typing import Iterator

import pytest
from tests.server_fixtures import ServerHandle, start_server, stop_server


@pytest.fixture(scope="module")
def reward_server() -> Iterator[ServerHandle]:
    """A small shared server (two CPU slots) for the tests that only need verdicts."""
    handle = start_server("--slots", "2")
    yield handle
    stop_server(handle.process)
