"""Shared fixtures, and the `integration` mark on every test outside tests/unit/.

tests/unit/ holds pure tests (no root, sandbox, Ray, verl-sf server or child process);
tests/integration/ and tests/special_e2e/ start real ones. `pytest -m "not integration"` (or
`pytest tests/unit`) runs the pure tests anywhere; CI runs everything.
"""

from pathlib import Path

import pytest

pytest_plugins = ["tests.leaks", "tests.server_fixtures", "tests.ray_fixtures"]

INTEGRATION_DIRS = (Path(__file__).parent / "integration", Path(__file__).parent / "special_e2e")


# Modules that start Ray clusters of their own (several raylets): with the session's cluster, on one worker.
OWN_RAY_CLUSTERS = ("test_cluster.py", "test_pool_two_node.py")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(directory) for directory in INTEGRATION_DIRS):
            item.add_marker(pytest.mark.integration)
    # A module's tests run on one pytest-xdist worker (its module-scoped servers start once), and
    # every module on Ray on the same one (one Ray cluster at a time), first: the longest group.
    on_ray = {item.path for item in items
              if "ray_local" in getattr(item, "fixturenames", ()) or item.path.name in OWN_RAY_CLUSTERS}
    for item in items:
        item.add_marker(pytest.mark.xdist_group("ray" if item.path in on_ray else item.path.stem))
    items.sort(key=lambda item: item.path not in on_ray)
