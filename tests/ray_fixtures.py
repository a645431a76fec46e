"""Ray fixtures (owned by the pool work).

One real local Ray cluster per test session: starting Ray costs seconds and several
processes, and the machine is shared, so every test that needs Ray uses `ray_local`
instead of calling `ray.init` itself.  Tests that need a cluster of their own (the
two-node test) run it in a subprocess so the two never share a driver.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterator

import pytest

RAY_TEST_NAMESPACE = "verl-sf-tests"


@dataclasses.dataclass(frozen=True)
class RayCluster:
    address: str          # GCS address, for `ray.init(address=...)` in subprocesses
    namespace: str        # the driver's namespace; named actors (the limiter) live here
    metrics_port: int     # Prometheus endpoint of this node: http://127.0.0.1:{port}/metrics


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def ray_local() -> Iterator[RayCluster]:
    """A local Ray cluster (4 logical CPUs, no dashboard) for the whole session."""
    import ray

    metrics_port = free_port()
    # RAY_ADDRESS in the environment would make ray.init join some other cluster.
    os.environ.pop("RAY_ADDRESS", None)
    context = ray.init(
        num_cpus=4,
        include_dashboard=False,
        namespace=RAY_TEST_NAMESPACE,
        object_store_memory=128 * 1024 * 1024,
        _metrics_export_port=metrics_port,
        log_to_driver=True,
    )
    try:
        yield RayCluster(context.address_info["gcs_address"], RAY_TEST_NAMESPACE, metrics_port)
    finally:
        ray.shutdown()
