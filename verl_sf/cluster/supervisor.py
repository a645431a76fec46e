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
import logging
import threading
from typing import Any, Optional

from verl_sf.cluster.names import SERVER_PREFIX, node_of, server_name
from verl_sf.cluster.node_server import NodeServer
from verl_sf.server.fleet import node_tag

log = logging.getLogger(__name__)
DEFAULT_POLL_S = 2.0
INFO_WAIT_S = 2.0  # a server actor still starting is left out of this pass's directory


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
        self._thread = threading.Thread(target=self._loop, name="verl-sf-fleet", daemon=True)
        self._thread.start()

    def settings(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "resource": self.resource, "serve_args": self.serve_args}

    def reconcile(self) -> list[str]:
        """One pass now; returns the nodes that have (or are getting) a server."""
        import ray

        with self._lock:
            nodes = {node["NodeID"] for node in eligible_nodes(self.resource)}
            placed = {node_of(name) for name in server_actor_names(self.namespace)}
            for node_id in sorted(nodes - placed):
                log.info("placing a sandbox server on node %s", node_id)
                place_server(node_id, self.namespace, self.serve_args)
            for node_id in sorted(placed - nodes):
                log.info("node %s left (or lost its resource): releasing its server actor", node_id)
                with contextlib.suppress(ValueError):  # already gone
                    ray.kill(ray.get_actor(server_name(node_id), namespace=self.namespace), no_restart=True)
            self._publish()
            return sorted(nodes)

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
