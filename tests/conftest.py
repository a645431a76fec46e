"""Shared fixtures, and the `integration` mark on every test outside tests/unit/.

tests/unit/ holds pure tests (no root, sandbox, Ray, verl-sf server or child process);
tests/integration/ and tests/special_e2e/ start real ones. `pytest -m "not integration"` (or
`pytest tests/unit`) runs the pure tests anywhere; CI runs everything.
"""

from pathlib import Path

import pytest

pytest_plugins = ["tests.leaks", "tests.server_fixtures", "tests.ray_fixtures"]

INTEGRATION_DIRS = (Path(__file__).parent / "integration", Path(__file__).parent / "special_e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(directory) for directory in INTEGRATION_DIRS):
            item.add_marker(pytest.mark.integration)
