#!/usr/bin/env python3
"""A pool of Daytona sandboxes over a `verl-sf cluster` fleet, as TRL + Daytona's `train.py` makes it.

Starts a local Ray cluster of `--nodes` raylets (each a Ray node carrying `sandbox`), brings the
fleet up with the real CLI, points the unmodified `daytona` SDK at ONE server's URL, creates
`--sandboxes` sandboxes at once (`asyncio.gather` of `AsyncDaytona.create()`, as train.py does), runs
one `code_interpreter.run_code(..., timeout=1)` in each, deletes them all, and prints how the pool
spread over the fleet's servers (sandbox ids name their server) and how long each step took.

    python scripts/fleet_pool.py [--nodes 3] [--sandboxes 500] [--slots 2] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE = "verl-sf-fleet-pool"


def cli(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_sf.cli", "cluster", *args, "--address", address,
                           "--namespace", NAMESPACE], capture_output=True, text=True, timeout=600, cwd=ROOT)


async def pool(url: str, count: int) -> dict[str, Any]:
    from daytona import AsyncDaytona, DaytonaConfig, DaytonaError

    client = AsyncDaytona(DaytonaConfig(api_key="fleet-pool", api_url=f"{url}/api"))
    try:
        async def create() -> tuple[float, Any]:
            started = time.perf_counter()
            try:
                box: Any = await client.create(timeout=120)
            except DaytonaError as exc:  # refused (503 past every server's caps): counted, never half-made
                box = exc
            return time.perf_counter() - started, box

        started = time.perf_counter()
        created = await asyncio.gather(*(create() for _ in range(count)))
        create_wall = time.perf_counter() - started
        boxes = [box for _, box in created if not isinstance(box, Exception)]
        refused = [str(box)[:200] for _, box in created if isinstance(box, Exception)]
        started = time.perf_counter()
        ran = await asyncio.gather(*(box.code_interpreter.run_code("print(6 * 7)", timeout=1) for box in boxes),
                                   return_exceptions=True)
        run_wall = time.perf_counter() - started
        right = sum(1 for result in ran if not isinstance(result, BaseException) and result.stdout == "42\n")
        per_server = collections.Counter(box.id.split("-")[0] for box in boxes)
        started = time.perf_counter()
        await asyncio.gather(*(box.delete() for box in boxes))
        delete_wall = time.perf_counter() - started
        left = [box async for box in client.list()]
        times = sorted(seconds for seconds, box in created if not isinstance(box, Exception))
        return {
            "sandboxes": count, "created": len(boxes), "refused": len(refused), "refusals": refused[:3],
            "per_server": dict(sorted(per_server.items())),
            "create_wall_s": round(create_wall, 2),
            "p50_create_s": round(statistics.median(times), 3) if times else None,
            "p95_create_s": round(times[int(0.95 * (len(times) - 1))], 3) if times else None,
            "run_code_right": right, "run_wall_s": round(run_wall, 2),
            "delete_wall_s": round(delete_wall, 2), "left_after_delete": len(left),
        }
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=500)
    parser.add_argument("--slots", type=int, default=2, help="each server's --slots")
    parser.add_argument("--output", default=None, help="also write the summary here (JSON)")
    args = parser.parse_args()

    from ray.cluster_utils import Cluster

    os.environ.pop("RAY_ADDRESS", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="vsfp-", dir="/tmp")
    node_args = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "resources": {"sandbox": 1}}
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={**node_args, "include_dashboard": False})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(**node_args)
        up = cli(cluster.address, "up", "--resource", "sandbox", "--slots", str(args.slots))
        if up.returncode != 0:
            print(up.stdout, up.stderr[-3000:], file=sys.stderr)
            return 1
        rows = [json.loads(line) for line in cli(cluster.address, "status", "--json").stdout.splitlines()
                if line.startswith("{")]
        url = rows[0]["url"]
        time.sleep(3)  # the supervisor hands every server the fleet's directory (every 2 s)
        summary = {"nodes": args.nodes, "slots_per_server": args.slots, "client_url": url,
                   "servers": {"n" + row["node_id"][:12]: row["url"] for row in rows},
                   **asyncio.run(pool(url, args.sandboxes))}
    finally:
        cli(cluster.address, "down")
        cluster.shutdown()
    print(json.dumps(summary, indent=2))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(summary, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
