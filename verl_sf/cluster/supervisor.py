"""`FleetSupervisor`: a small detached actor that keeps one `NodeServer` on every eligible node.

Every `poll_s` it compares Ray's live nodes (those carrying `resource`, when one is named)
with the named server actors: a node without one gets one, pinned to it with a hard
`NodeAffinitySchedulingStrategy`; the actor of a node that left is killed so its name is
free.  Then every server actor is handed the fleet's directory (each listening server's URL),
by which the servers route E2B and Daytona calls to the server that holds their sandbox.
Ray itself restarts a server actor that dies (`max_restarts=-1`) and this actor too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, Optional

from verl_sf.cluster.names import SERVER_PREFIX, node_of, server_name
from verl_sf.cluster.node_server import NodeServer
from verl_sf.server.fleet import node_tag

log = logging.getLogger(__name__)
DEFAULT_POLL_S = 2.0
INFO_WAIT_S = 2.0  # a server actor still starting is left out of this pass's directory
MAX_RETRY_S = 60.0  # a node whose server keeps failing to start is tried again at most this far apart


@dataclasses.dataclass
class _Failure:
    """Why a node's server did not start, and when to place one there again."""

    error: str
    retry_at: float
    backoff_s: float


def eligible_nodes(resource: Optional[str]) -> list[dict[str, Any]]:
    """Ray's live nodes, those with some of `resource` when it is given."""
    import ray

    return [node for node in ray.nodes()
            if node["Alive"] and (resource is None or node["Resources"].get(resource, 0) > 0)]


def place_server(node_id: str, namespace: str, serve_args: list[str]) -> Any:
    """The node's server actor: created (detached, pinned, restarted forever), or the existing one."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_class = ray.remote(NodeServer)
    return actor_class.options(
        name=server_name(node_id), namespace=namespace, get_if_exists=True, lifetime="detached",
        max_restarts=-1, max_concurrency=8, num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(serve_args)


def server_actor_names(namespace: str) -> list[str]:
    import ray

    return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry["namespace"] == namespace and entry["name"].startswith(SERVER_PREFIX))


class FleetSupervisor:
    """Places and forgets server actors as nodes come and go; holds the fleet's settings."""

    def __init__(self, namespace: str, resource: Optional[str], serve_args: list[str],
                 poll_s: float = DEFAULT_POLL_S):
        self.namespace = namespace
        self.resource = resource
        self.serve_args = list(serve_args)
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._starting: dict[str, Any] = {}  # node -> its new server actor's ready ref
        self._failed: dict[str, _Failure] = {}
        self._thread = threading.Thread(target=self._loop, name="verl-sf-fleet", daemon=True)
        self._thread.start()

    def settings(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "resource": self.resource, "serve_args": self.serve_args}

    def reconcile(self) -> list[str]:
        """One pass now; returns the nodes that have (or are getting) a server."""
        import ray

        with self._lock:
            self._collect()
            nodes = {node["NodeID"] for node in eligible_nodes(self.resource)}
            placed = {node_of(name) for name in server_actor_names(self.namespace)}
            now = time.monotonic()
            for node_id in sorted(nodes - placed):
                failure = self._failed.get(node_id)
                if node_id in self._starting or (failure is not None and now < failure.retry_at):
                    continue
                log.info("placing a sandbox server on node %s", node_id)
                self._starting[node_id] = place_server(node_id, self.namespace, self.serve_args).__ray_ready__.remote()
            for node_id in sorted(placed - nodes):
                log.info("node %s left (or lost its resource): releasing its server actor", node_id)
                with contextlib.suppress(ValueError):  # already gone
                    ray.kill(ray.get_actor(server_name(node_id), namespace=self.namespace), no_restart=True)
            self._publish()
            return sorted(nodes)

    def start_errors(self) -> dict[str, str]:
        """Node -> why its server did not start, for the nodes whose last start failed."""
        with self._lock:
            self._collect()
            return {node_id: failure.error for node_id, failure in self._failed.items()}

    def _collect(self) -> None:
        """The outcome of every start that has one (a server actor whose constructor raised is gone)."""
        import ray

        if not self._starting:
            return
        ready, _ = ray.wait(list(self._starting.values()), num_returns=len(self._starting), timeout=0)
        for node_id, ref in list(self._starting.items()):
            if ref not in ready:
                continue
            del self._starting[node_id]
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                backoff = min(MAX_RETRY_S, 2 * self._failed[node_id].backoff_s if node_id in self._failed
                              else self.poll_s)
                error = _start_error(exc)
                log.error("the sandbox server on node %s did not start (trying again in %.0f s): %s",
                          node_id, backoff, error)
                self._failed[node_id] = _Failure(error, time.monotonic() + backoff, backoff)
            else:
                self._failed.pop(node_id, None)

    def _publish(self) -> None:
        """Every server actor gets the URLs of the servers listening now."""
        import ray

        actors = []
        for name in server_actor_names(self.namespace):
            with contextlib.suppress(ValueError):  # released since it was listed
                actors.append(ray.get_actor(name, namespace=self.namespace))
        infos = [actor.info.remote() for actor in actors]
        ready, _ = ray.wait(infos, num_returns=len(infos), timeout=INFO_WAIT_S)
        servers = {}
        for ref in ready:
            with contextlib.suppress(ray.exceptions.RayError):
                info = ray.get(ref)
                if info["url"] is not None:
                    servers[node_tag(info["node_id"])] = info["url"]
        for actor in actors:
            actor.set_fleet.remote(servers)

    def shutdown(self) -> None:
        """Stop placing servers (`cluster down` then stops the servers themselves)."""
        self._stop.set()
        with self._lock:  # a pass in progress finishes before down lists the actors
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.reconcile()
            except Exception:  # a GCS hiccup must not end supervision: the next pass retries
                log.exception("fleet reconcile failed")


def _start_error(error: Exception) -> str:
    """The line of a failed constructor's error that says why (Ray's message holds its traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return next((line for line in reversed(lines) if "did not start" in line), lines[-1] if lines else "")[:500]
