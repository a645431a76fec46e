"""`verl-sf cluster` on a real local multi-node Ray cluster, routed by the real `cluster` backend.

`ray.cluster_utils.Cluster` starts a head and worker raylets on this machine, each a Ray node
with its own node id and resources: node A (head) and node B carry `sandbox`, node C does not.
The fleet is brought up with the real CLI (`verl-sf cluster up --resource sandbox`), and every
caller is a Ray task in a driver subprocess (tests/integration/cluster_driver.py), pinned to
its node.  The tests run in file order: the later ones take node B away and add a node.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "verl-sf-cluster-test"
SERVE_FLAGS = ["--slots", "2", "--max-in-flight", "64"]
NODE_ARGS = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """The cluster's processes (and so the servers) get a TMPDIR of their own: what the servers
    create there is theirs, whatever other processes on the machine do in /tmp."""
    from ray.cluster_utils import Cluster

    os.environ.pop("RAY_ADDRESS", None)
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "TMPDIR")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="vsfc-", dir="/tmp")
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            **NODE_ARGS, "resources": {"sandbox": 1, "node_a": 1}, "include_dashboard": False})
        cluster.add_node(**NODE_ARGS, resources={"sandbox": 1, "node_b": 1})
        cluster.add_node(**NODE_ARGS, resources={"node_c": 1})
        yield cluster
    finally:
        if cluster is not None:
            cli(cluster, "down", "--namespace", NAMESPACE)
            cluster.shutdown()
        shutil.rmtree(os.environ["TMPDIR"], ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def cli(cluster: Any, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_sf.cli", "cluster", *args, "--address", cluster.address],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def status(cluster: Any, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    proc = cli(cluster, "status", "--json", "--namespace", namespace)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def drive(cluster: Any, scenario: str, **args: Any) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "tests.integration.cluster_driver", scenario, cluster.address,
                           NAMESPACE, json.dumps(args)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def node_ids(cluster: Any) -> dict[str, str]:
    """Resource tag -> node id, read from the raylets the fixture started."""
    tags = {}
    for node in [cluster.head_node, *cluster.worker_nodes]:
        resources = node._ray_params.resources or {}
        tag = next((name for name in resources if name.startswith("node_")), None)
        if tag:
            tags[tag] = node.node_id
    return tags


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo += children.get(current, [])
    return found


def state_dirs() -> set[Path]:
    """The servers' private state directories (the cluster's processes have a TMPDIR of their own)."""
    return set(Path(os.environ["TMPDIR"]).glob("verl-sf-*"))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_one_server_per_node_and_down_leaves_nothing(ray_cluster: Any) -> None:
    """Without --resource every node gets one server; `down` leaves no process, cgroup or directory."""
    namespace = "verl-sf-cluster-test-all"
    up = cli(ray_cluster, "up", "--namespace", namespace, *SERVE_FLAGS)
    assert up.returncode == 0, up.stdout + up.stderr[-3000:]
    rows = status(ray_cluster, namespace)
    assert sorted(row["node_id"] for row in rows) == sorted(node_ids(ray_cluster).values())
    assert all(row["health"] == "ok" and row["slots"] == 2 for row in rows), rows
    assert all(re.fullmatch(r"http://[\d.]+:\d+", row["url"]) for row in rows), rows
    assert len({row["url"] for row in rows}) == 3
    processes = set().union(*(descendants(row["pid"]) for row in rows))
    dirs = state_dirs()
    assert len(dirs) >= 3, "each server keeps a state directory"
    assert len(processes) > 3, "the servers' sandboxes are running"

    down = cli(ray_cluster, "down", "--namespace", namespace)
    assert down.returncode == 0, down.stderr[-3000:]
    assert "stopped 3 sandbox server(s)" in down.stdout
    assert status(ray_cluster, namespace) == []
    assert wait_until(lambda: not [pid for pid in processes if alive(pid)], 30, "every server process is gone",
                      every=2), \
        [pid for pid in processes if alive(pid)]
    assert state_dirs() == set()
    cgroups = [p for row in rows for p in Path("/sys/fs/cgroup").glob(f"verl-sf-{row['pid']}-*")]
    assert cgroups == []


def test_servers_that_cannot_start_fail_up_and_leave_nothing(ray_cluster: Any) -> None:
    """Red team, 2026-12-07: `up` with serve flags no server starts with answered 0 and an empty table;
    the servers' start errors were only in Ray's logs, a server actor was placed again every 2 s, and
    each left its state directory behind."""
    namespace = "verl-sf-cluster-test-bad"
    before = state_dirs()
    up = cli(ray_cluster, "up", "--namespace", namespace, "--resource", "sandbox", *SERVE_FLAGS,
             "--python", "/nonexistent/python")
    assert up.returncode == 2, up.stdout + up.stderr[-3000:]
    nodes = node_ids(ray_cluster)
    for tag in ("node_a", "node_b"):
        assert f"the server on node {nodes[tag]} did not start" in up.stderr, up.stderr[-3000:]
    assert nodes["node_c"] not in up.stderr
    assert "verl-sf cluster down" in up.stderr
    assert state_dirs() == before
    down = cli(ray_cluster, "down", "--namespace", namespace)
    assert down.returncode == 0, down.stderr[-3000:]
    assert status(ray_cluster, namespace) == []


def test_the_fleet_is_joined_once_from_many_threads(ray_cluster: Any) -> None:
    """Red team, 2026-12-07: the cluster backend joins Ray from each event loop's thread, and two threads
    raced to `ray.init` ("Perhaps you called ray.init twice by accident?"), a sandbox failure to callers."""
    code = ("import sys, threading\nfrom verl_sf.cluster import fleet\nerrors = []\n"
            "def join():\n    try:\n        fleet.connect(sys.argv[1], 'verl-sf-cluster-test-driver')\n"
            "    except Exception as exc:\n        errors.append(repr(exc))\n"
            "threads = [threading.Thread(target=join) for _ in range(6)]\n"
            "for thread in threads:\n    thread.start()\nfor thread in threads:\n    thread.join()\n"
            "print(errors)\n")
    proc = subprocess.run([sys.executable, "-c", code, ray_cluster.address], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def fleet(ray_cluster: Any) -> Any:
    up = cli(ray_cluster, "up", "--namespace", NAMESPACE, "--resource", "sandbox", *SERVE_FLAGS)
    assert up.returncode == 0, up.stdout + up.stderr[-3000:]
    return ray_cluster


def test_servers_only_on_sandbox_nodes(fleet: Any) -> None:
    ids = node_ids(fleet)
    rows = status(fleet)
    assert sorted(row["node_id"] for row in rows) == sorted([ids["node_a"], ids["node_b"]])
    assert all(row["health"] == "ok" for row in rows)
    again = cli(fleet, "up", "--namespace", NAMESPACE, "--resource", "sandbox", *SERVE_FLAGS)
    assert again.returncode == 0, "re-running `up` with the same settings is a no-op"
    other = cli(fleet, "up", "--namespace", NAMESPACE, "--resource", "sandbox", "--slots", "3")
    assert other.returncode == 2 and "already up" in other.stderr


def test_caller_is_served_by_its_own_node(fleet: Any) -> None:
    ids = node_ids(fleet)
    urls = {row["node_id"]: row["url"] for row in status(fleet)}
    for tag in ("node_a", "node_b"):
        result = drive(fleet, "calls", node=tag, n=4)
        assert result["node_id"] == ids[tag]
        assert result["stdout"] == ["1\n"] * 4
        served = {url: s["served"] for url, s in result["stats"].items() if s["served"]}
        assert served == {urls[ids[tag]]: 4}, result["stats"]


def test_saturated_local_server_spills_to_the_other(fleet: Any) -> None:
    """With this process's calls on its local server at `spill_at`, further calls go to the other server."""
    ids = node_ids(fleet)
    urls = {row["node_id"]: row["url"] for row in status(fleet)}
    result = drive(fleet, "calls", node="node_a", n=12, concurrency=4, spill_at=2, sleep=0.3)
    assert result["stdout"] == ["1\n"] * 12
    served = {url: s["served"] for url, s in result["stats"].items()}
    assert served[urls[ids["node_a"]]] >= 6, "the local server is filled first"
    assert served[urls[ids["node_b"]]] >= 1, "the rest spilled to the other node"
    assert sum(served.values()) == 12


def test_caller_without_sandbox_resource_is_served_by_a_sandbox_node(fleet: Any) -> None:
    ids = node_ids(fleet)
    urls = {row["url"] for row in status(fleet)}
    result = drive(fleet, "calls", node="node_c", n=4)
    assert result["node_id"] == ids["node_c"]
    assert result["stdout"] == ["1\n"] * 4
    served = {url for url, s in result["stats"].items() if s["served"]}
    assert served and served <= urls


def test_e2b_and_daytona_sandboxes_reached_through_one_node(fleet: Any) -> None:
    """The SDKs pointed at node A's server: new sandboxes go round the fleet, every call reaches the server
    holding its sandbox, and a sandbox whose server was killed is not found (its actor brings the server
    back on its URL, but not the sandbox)."""
    from daytona import Daytona, DaytonaConfig, DaytonaNotFoundError
    from e2b import NotFoundException
    from e2b_code_interpreter import Sandbox

    ids = node_ids(fleet)
    rows = {row["node_id"]: row for row in status(fleet)}
    url = rows[ids["node_a"]]["url"]
    tags = {name: "n" + ids[name][:12] for name in ("node_a", "node_b")}
    options = {"api_key": "fleet-key", "api_url": url, "sandbox_url": url}

    def spread() -> list[Any]:  # the supervisor hands each server the fleet's directory within seconds
        boxes = [Sandbox.create(timeout=120, **options) for _ in range(2)]
        if {box.sandbox_id.split("-")[0] for box in boxes} == set(tags.values()):
            return boxes
        for box in boxes:
            box.kill()
        return []

    boxes = wait_until(spread, 60, "new sandboxes go to both servers", every=1)
    for box in boxes:
        box.files.write("/home/user/id.txt", box.sandbox_id)
        assert box.run_code("open('/home/user/id.txt').read()").text == box.sandbox_id  # E2B drops a str's quotes
    daytona = Daytona(DaytonaConfig(api_key="fleet-key", api_url=f"{url}/api"))
    made = [daytona.create() for _ in range(2)]
    assert {box.id.split("-")[0] for box in made} == set(tags.values())
    assert [box.code_interpreter.run_code("print(6 * 7)").stdout for box in made] == ["42\n", "42\n"]

    os.kill(rows[ids["node_b"]]["pid"], signal.SIGKILL)
    on_b = next(box for box in boxes if box.sandbox_id.startswith(tags["node_b"]))
    with pytest.raises(NotFoundException):
        on_b.run_code("1")
    wait_until(lambda: [r for r in status(fleet) if r["node_id"] == ids["node_b"] and r["health"] == "ok"
                        and r["pid"] != rows[ids["node_b"]]["pid"]], 120, "node_b's server is restarted", every=2)
    with pytest.raises(NotFoundException):
        on_b.run_code("1")
    with pytest.raises(DaytonaNotFoundError):
        daytona.get(next(box.id for box in made if box.id.startswith(tags["node_b"])))
    on_a = next(box for box in boxes if box.sandbox_id.startswith(tags["node_a"]))
    assert on_a.run_code("2 + 2").text == "4"
    on_a.kill()
    for box in made:
        if box.id.startswith(tags["node_a"]):
            box.delete()


def test_sigkill_server_under_load(fleet: Any) -> None:
    """Calls not yet started when the server dies go elsewhere; running ones are reported, never lost."""
    ids = node_ids(fleet)
    concurrency = 6
    result = drive(fleet, "load", node="node_a", n=40, concurrency=concurrency, kill_after=8)
    assert result["errors"] == []
    assert result["ok"] + result["interrupted"] == 40
    assert result["interrupted"] <= concurrency, "only calls that were running can be interrupted"
    assert result["ok"] >= 40 - concurrency
    other = next(row["url"] for row in status(fleet) if row["node_id"] == ids["node_b"])
    assert result["stats"][other]["served"] >= 1, "calls sent while the local server was down went to the other"
    rows = wait_until(lambda: [r for r in status(fleet) if r["node_id"] == ids["node_a"] and r["health"] == "ok"
                               and r["pid"] != result["killed_pid"]], 120, "node_a's server is restarted", every=2)
    assert rows[0]["restarts"] >= 1
    assert rows[0]["url"] == result["killed_url"], "the server comes back on its URL"
    assert not alive(result["killed_pid"])


def test_crashed_server_actor_is_restarted_by_ray(fleet: Any) -> None:
    ids = node_ids(fleet)
    result = drive(fleet, "crash_actor", node_id=ids["node_a"])
    assert result["after"] is not None, "Ray restarted the actor and it started a server"
    assert result["after"]["pid"] != result["before"]["pid"]
    wait_until(lambda: not alive(result["before"]["pid"]), 30, "the old server died with its actor", every=2)
    assert drive(fleet, "calls", node="node_a", n=2)["stdout"] == ["1\n"] * 2


def test_sessions_stay_on_their_server(fleet: Any) -> None:
    result = drive(fleet, "session", node="node_b")
    assert result["first"] == "Success"
    assert result["second"] == "42\n"
    assert list(result["served"]) == [result["session_url"]], "every call of the session went to its server"
    assert result["same_session"], "both calls of the key ran in one server session"
    assert result["gone"] and ("died" in result["gone"] or "does not know" in result["gone"]), result["gone"]
    assert result["fresh"] == "False\n" and result["fresh_session"], "after SessionGone the key starts afresh"


def test_forks_and_snapshots_live_on_their_sessions_server(fleet: Any) -> None:
    """Forked from node B, opened from the snapshot on node A: every step goes to the session's server."""
    wait_until(lambda: len([s for s in status(fleet) if s.get("url")]) == 2, 120, "both servers listen", every=2)
    forked = drive(fleet, "fork", node="node_b")
    assert forked["parent_url"] and forked["fork_urls"] == [forked["parent_url"]] * 2, forked
    assert forked["fork_stdout"] == ["42\n", "42\n"]
    assert forked["snapshot_url"] == forked["parent_url"]
    opened = drive(fleet, "from_snapshot", node="node_a", snapshot_id=forked["snapshot_id"])
    assert opened["url"] == forked["parent_url"] and opened["stdout"] == "41\n", opened
    assert opened["local_urls"] != [forked["parent_url"]], "the opener's own node runs another server"
    assert opened["gone"] and "no server of the fleet knows it" in opened["gone"], opened


def test_node_leaving_and_joining(fleet: Any) -> None:
    ids = node_ids(fleet)
    node_b = next(node for node in fleet.worker_nodes if node.node_id == ids["node_b"])
    b_pid = next(row["pid"] for row in status(fleet) if row["node_id"] == ids["node_b"])
    fleet.remove_node(node_b)
    wait_until(lambda: [r["node_id"] for r in status(fleet)] == [ids["node_a"]], 120, "only node_a's server is listed",
               every=2)
    wait_until(lambda: not alive(b_pid), 30, "the server of a node that left is gone", every=2)
    result = drive(fleet, "calls", node="node_c", n=2)
    assert result["stdout"] == ["1\n"] * 2

    joined = fleet.add_node(**NODE_ARGS, resources={"sandbox": 1, "node_d": 1})
    rows = wait_until(lambda: [r for r in status(fleet) if r["node_id"] == joined.node_id and r["health"] == "ok"],
                      120, "the joined node's server is up", every=2)
    assert drive(fleet, "calls", node="node_d", n=2)["stats"][rows[0]["url"]]["served"] == 2


async def test_rollout_with_the_cluster_backend(fleet: Any, tmp_path: Path) -> None:
    """`verl-sf rollout` with a `backend: cluster` tool: joins Ray from RAY_ADDRESS, runs the code on the fleet."""
    from tests.special_e2e.policy_server import Call, PolicyServer, Script, Turn
    from tests.subprocesses import communicate_or_kill

    tools = tmp_path / "tools.yaml"
    tools.write_text((ROOT / "configs" / "cluster_tool_config.yaml").read_text()
                     .replace('namespace: "verl-sf-cluster"', f'namespace: "{NAMESPACE}"'))
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Q-code"}],
                                "reward_model": {"ground_truth": "42"}, "extra_info": {}}) + "\n")
    call = Call("code_interpreter", json.dumps({"code": "print(6 * 7)"}))
    script = Script([Turn("", [call]), Turn("So #### {tool}")])
    async with PolicyServer({"Q-code": script}) as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "verl_sf.cli", "rollout", "--server", server.url, "--data", str(data),
            "--tool-config", str(tools), "--n", "2", "--no-progress", cwd=ROOT,
            env={**os.environ, "RAY_ADDRESS": fleet.address},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await communicate_or_kill(proc, timeout=240)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    assert "accuracy: 1.0000" in stdout.decode(), stdout.decode()
