"""The cap holds across a two-node Ray cluster on this machine.

`ray.cluster_utils.Cluster` starts a head and a second raylet (two nodes with their own
node ids and resources).  It runs in a subprocess driver so it never shares a process with
the session's `ray_local` cluster.  One pool is pinned to each node; their sandbox runs
print start/end timestamps, which must never overlap deeper than `rate_limit`.

Run directly: python -m tests.integration.test_pool_two_node <sandbox run_code URL>
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.server_fixtures import ServerHandle

pytestmark = pytest.mark.ray

RATE_LIMIT = 2
CALLS_PER_POOL = 5


async def run_on_node(backend, request):
    """Executed in a pool actor: the sandbox's own timestamps, and which node ran the call."""
    import ray

    response = await backend.run_code(request)
    return ray.get_runtime_context().get_node_id(), response.model_dump(mode="json")


def drive(sandbox_url: str) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from tests.intervals import max_overlap
    from tests.pool_helpers import timed_request
    from verl_sf.backends.http import HttpSandboxBackend
    from verl_sf.models import RunCodeResponse
    from verl_sf.pool import init_execution_pool, shutdown_global_limiter

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"node_a": 1}, "include_dashboard": False,
        "object_store_memory": 96 * 1024 * 1024})
    cluster.add_node(num_cpus=2, resources={"node_b": 1}, object_store_memory=96 * 1024 * 1024)
    try:
        ray.init(address=cluster.address, namespace="verl-sf-two-node")
        cluster.wait_for_nodes()
        pools = [init_execution_pool(4, rate_limit=RATE_LIMIT, resources={node: 0.01})
                 for node in ("node_a", "node_b")]
        backend = HttpSandboxBackend(sandbox_url)

        async def run_all():
            return await asyncio.gather(*[pools[i % 2].execute.remote(run_on_node, backend, timed_request(0.4))
                                          for i in range(2 * CALLS_PER_POOL)])

        results = asyncio.run(run_all())
        intervals = []
        for _, payload in results:
            stdout = RunCodeResponse.model_validate(payload).run_result.stdout
            start, end = (float(x) for x in stdout.split())
            intervals.append((start, end))
        stats = ray.get(pools[0].stats.remote())["limiter"]
        for pool in pools:
            ray.kill(pool)
        shutdown_global_limiter()
        return {
            "nodes_in_cluster": len([n for n in ray.nodes() if n["Alive"]]),
            "nodes_used": sorted({node for node, _ in results}),
            "max_overlap": max_overlap(intervals),
            "leases": stats["leases"],
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_cap_holds_across_two_nodes(sf_server: ServerHandle) -> None:
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.integration.test_pool_two_node", sf_server.run_code_url],
                          capture_output=True, text=True, timeout=400, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["nodes_in_cluster"] == 2
    assert len(report["nodes_used"]) == 2, "each pool should run on its own node"
    assert report["max_overlap"] <= RATE_LIMIT
    assert report["leases"] == 2


if __name__ == "__main__":
    print(json.dumps(drive(sys.argv[1])))
