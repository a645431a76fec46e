"""Ray drivers for tests/integration/test_cluster.py, run as subprocesses (one driver per scenario).

    python -m tests.integration.cluster_driver SCENARIO ADDRESS NAMESPACE [JSON ARGS]

Each scenario prints one JSON line: what happened, as data the test asserts on.  Callers are
Ray tasks pinned to a node by a resource only that node carries (`node_a`, `node_b`, ...), so
"the caller's node" is a real Ray node id, as in a rollout worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any, Optional

import ray

from tests.waiting import wait_until
from verl_sf.backends.cluster import ClusterSandboxBackend, SandboxCallInterrupted
from verl_sf.errors import SessionGone, SnapshotGone
from verl_sf.models import RunCodeRequest


def _backend(namespace: str, spill_at: int | None = None) -> ClusterSandboxBackend:
    return ClusterSandboxBackend(namespace=namespace, refresh_s=2.0, spill_at=spill_at)


@ray.remote(num_cpus=0)
def calls_from_here(namespace: str, n: int, concurrency: int = 1, spill_at: int | None = None,
                    sleep: float = 0.0) -> dict[str, Any]:
    """n `print(1)` calls (after `sleep` s in the sandbox) at `concurrency` from this task's node: who served them."""
    code = f"import time\ntime.sleep({sleep})\nprint(1)" if sleep else "print(1)"

    async def run() -> dict[str, Any]:
        async with _backend(namespace, spill_at) as backend:
            slots = asyncio.Semaphore(concurrency)

            async def one() -> str | None:
                async with slots:
                    result = (await backend.run_code(RunCodeRequest(code=code, language="python"))).run_result
                    return result.stdout if result else None

            outputs = await asyncio.gather(*(one() for _ in range(n)))
            return {"node_id": ray.get_runtime_context().get_node_id(), "stats": backend.stats(),
                    "stdout": outputs}

    return asyncio.run(run())


@ray.remote(num_cpus=0)
def load_and_kill_local_server(namespace: str, n: int, concurrency: int, kill_after: int) -> dict[str, Any]:
    """n calls of ~0.3 s at `concurrency`; after `kill_after` of them finished, SIGKILL this node's server."""
    from verl_sf.cluster import fleet

    node_id = ray.get_runtime_context().get_node_id()
    local = next(info for info in fleet.server_infos(namespace) if info["node_id"] == node_id)
    outcomes: dict[str, int] = {"ok": 0, "interrupted": 0}
    errors: list[str] = []
    killed = asyncio.Event()

    async def one(backend: ClusterSandboxBackend, slots: asyncio.Semaphore) -> None:
        async with slots:
            try:
                response = await backend.run_code(RunCodeRequest(
                    code="import time\ntime.sleep(0.3)\nprint('done')", language="python"))
            except SandboxCallInterrupted:
                outcomes["interrupted"] += 1
            except Exception as exc:  # anything else is a lost call: the test reports it
                errors.append(f"{type(exc).__name__}: {exc}")
            else:
                if response.run_result and response.run_result.stdout == "done\n":
                    outcomes["ok"] += 1
                else:
                    errors.append(f"wrong answer: {response.model_dump_json()[:300]}")
            if not killed.is_set() and outcomes["ok"] >= kill_after:
                os.kill(local["pid"], signal.SIGKILL)
                killed.set()

    async def run() -> dict[str, Any]:
        async with _backend(namespace) as backend:
            slots = asyncio.Semaphore(concurrency)
            await asyncio.gather(*(one(backend, slots) for _ in range(n)))
            return {"killed_pid": local["pid"], "killed_url": local["url"], **outcomes, "errors": errors,
                    "stats": backend.stats()}

    return asyncio.run(run())


@ray.remote(num_cpus=0)
def session_on_its_server(namespace: str) -> dict[str, Any]:
    """A session keeps its state across calls on its server; after that server is killed: SessionGone,
    and the same key's next call starts a fresh session."""
    from verl_sf.cluster import fleet

    async def run() -> dict[str, Any]:
        async with _backend(namespace) as backend:
            first = await backend.run_code(RunCodeRequest(code="x = 41", language="python"), session="traj")
            second = await backend.run_code(RunCodeRequest(code="print(x + 1)", language="python"), session="traj")
            served = {url: s["served"] for url, s in backend.stats().items() if s["served"]}
            assert first.session_id is not None
            url = backend.session_server(first.session_id)
            pid = next(i["pid"] for i in fleet.server_infos(namespace) if i["url"] == url)
            os.kill(pid, signal.SIGKILL)
            try:
                await backend.run_code(RunCodeRequest(code="print(x)", language="python"), session="traj")
                gone = None
            except SessionGone as exc:
                gone = exc.reason
            fresh = await backend.run_code(RunCodeRequest(code="print('x' in globals())", language="python"),
                                           session="traj")
            return {"first": first.status.value, "second": second.run_result.stdout if second.run_result else None,
                    "served": served, "session_url": url, "gone": gone, "same_session": second.session_id ==
                    first.session_id, "fresh": fresh.run_result.stdout if fresh.run_result else None,
                    "fresh_session": fresh.session_id not in (None, first.session_id)}

    return asyncio.run(run())


@ray.remote(num_cpus=0)
def fork_on_its_server(namespace: str) -> dict[str, Any]:
    """A session's forks and its snapshot are made on the session's server, and its forks run there."""

    async def run() -> dict[str, Any]:
        async with _backend(namespace) as backend:
            parent = await backend.run_code(RunCodeRequest(code="x = 41", language="python"), session="parent")
            forks = await backend.fork_session("parent", 2)
            replies = [await backend.run_code(RunCodeRequest(code="x += 1\nprint(x)", language="python"),
                                              session=key) for key in forks]
            snapshot = await backend.snapshot_session("parent")
            assert parent.session_id is not None
            result = {"parent_url": backend.session_server(parent.session_id),
                      "fork_urls": [backend.session_server(r.session_id or "") for r in replies],
                      "fork_stdout": [r.run_result.stdout if r.run_result else None for r in replies],
                      "snapshot_id": snapshot.snapshot_id,
                      "snapshot_url": backend.snapshot_server(snapshot.snapshot_id)}
            for key in forks:  # `close()` ends them all the same; the snapshot outlives this process
                await backend.end_session(key)
            return result

    return asyncio.run(run())


@ray.remote(num_cpus=0)
def open_from_snapshot(namespace: str, snapshot_id: str) -> dict[str, Any]:
    """Another process, on another node, opens a session from a snapshot it did not take, then deletes it."""

    async def run() -> dict[str, Any]:
        async with _backend(namespace) as backend:
            await backend.open_session("copy", from_snapshot=snapshot_id)
            reply = await backend.run_code(RunCodeRequest(code="print(x)", language="python"), session="copy")
            url = backend.session_server(reply.session_id or "")
            await backend.delete_snapshot(snapshot_id)
            try:
                await backend.open_session("again", from_snapshot=snapshot_id)
                gone = None
            except SnapshotGone as exc:
                gone = exc.reason
            local = [u for u, s in backend.stats().items() if s["local"]]
            return {"url": url, "stdout": reply.run_result.stdout if reply.run_result else None, "gone": gone,
                    "local_urls": local}

    return asyncio.run(run())


def crash_actor(namespace: str, node_id: str) -> dict[str, Any]:
    """Kill the node's server actor as a crash would (Ray restarts it); the old server must go with it."""
    from verl_sf.cluster import fleet
    from verl_sf.cluster.names import server_name

    before = next(i for i in fleet.server_infos(namespace) if i["node_id"] == node_id)
    ray.kill(ray.get_actor(server_name(node_id), namespace=namespace), no_restart=False)

    def restarted() -> Optional[dict[str, Any]]:
        infos = [i for i in fleet.server_infos(namespace, timeout_s=5) if i["node_id"] == node_id]
        return infos[0] if infos and infos[0]["url"] and infos[0]["pid"] != before["pid"] else None

    after = wait_until(restarted, 120, "Ray restarted the actor and its new server listens", every=1)
    return {"before": before, "after": after}


def main() -> None:
    scenario, address, namespace = sys.argv[1:4]
    args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    ray.init(address=address, namespace="verl-sf-cluster-test-driver", log_to_driver=False)
    pin = args.pop("node", None)
    options: dict[str, Any] = {"resources": {pin: 0.01}} if pin else {}
    if scenario == "calls":
        result = ray.get(calls_from_here.options(**options).remote(namespace, **args))
    elif scenario == "load":
        result = ray.get(load_and_kill_local_server.options(**options).remote(namespace, **args))
    elif scenario == "session":
        result = ray.get(session_on_its_server.options(**options).remote(namespace))
    elif scenario == "fork":
        result = ray.get(fork_on_its_server.options(**options).remote(namespace))
    elif scenario == "from_snapshot":
        result = ray.get(open_from_snapshot.options(**options).remote(namespace, **args))
    elif scenario == "crash_actor":
        result = crash_actor(namespace, **args)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
