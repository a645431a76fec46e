"""Driver-side fleet operations: up, status, down, and the server list the router reads.

These run in any process connected to Ray (the `verl-sf cluster` CLI, a training driver,
the `cluster` backend).  Nothing is stored outside Ray: the named actors are the fleet.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from verl_sf.cluster.names import DEFAULT_NAMESPACE, SUPERVISOR_NAME
from verl_sf.cluster.node_server import ServerInfo
from verl_sf.cluster.supervisor import DEFAULT_POLL_S, FleetSupervisor, server_actor_names
from verl_sf.errors import VerlSfError

INFO_TIMEOUT_S = 10.0


class FleetError(VerlSfError):
    """The fleet cannot be brought up as asked (already up with other settings, no eligible node, ...)."""


@dataclasses.dataclass
class ServerStatus:
    """One row of `verl-sf cluster status`."""

    node_id: str
    node_ip: str
    url: Optional[str]
    health: str  # ok | down | unreachable
    slots: Optional[int]
    in_flight: Optional[int]
    queued: Optional[int]
    sessions: Optional[int]
    restarts: int
    pid: Optional[int]
    fronts: Optional[int]
    error: Optional[str] = None


def connect(address: Optional[str] = None, namespace: str = DEFAULT_NAMESPACE) -> None:
    """Join the Ray cluster as Ray's own commands do: `address`, else RAY_ADDRESS, else `auto`."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", namespace=namespace,
                 log_to_driver=False, include_dashboard=False)


def _supervisor(namespace: str) -> Optional[Any]:
    import ray

    try:
        return ray.get_actor(SUPERVISOR_NAME, namespace=namespace)
    except ValueError:
        return None


def up(namespace: str, resource: Optional[str], serve_args: list[str], *, poll_s: float = DEFAULT_POLL_S,
       timeout_s: float = 180.0) -> list[ServerStatus]:
    """Start the supervisor (or find it with the same settings), place every server, wait until each answers."""
    import ray

    wanted = {"namespace": namespace, "resource": resource, "serve_args": list(serve_args)}
    supervisor: Any = _supervisor(namespace)
    if supervisor is not None:
        running = ray.get(supervisor.settings.remote(), timeout=INFO_TIMEOUT_S)
        if running != wanted:
            raise FleetError(f"a fleet is already up in namespace {namespace!r} with {running}; "
                             f"run `verl-sf cluster down` first to change it to {wanted}")
    else:
        supervisor = ray.remote(FleetSupervisor).options(  # type: ignore[attr-defined]
            name=SUPERVISOR_NAME, namespace=namespace, get_if_exists=True, lifetime="detached",
            max_restarts=-1, max_task_retries=-1, num_cpus=0,
        ).remote(namespace, resource, list(serve_args), poll_s)
    nodes = ray.get(supervisor.reconcile.remote(), timeout=timeout_s)
    if not nodes:
        raise FleetError(f"no live Ray node carries the resource {resource!r}" if resource
                         else "the Ray cluster has no live node")
    return status(namespace, timeout_s=timeout_s)


def server_infos(namespace: str, timeout_s: float = INFO_TIMEOUT_S) -> list[ServerInfo]:
    """Every server actor's `info()`; actors that do not answer in time (restarting, node gone) are left out."""
    import ray

    handles: list[Any] = []
    for name in server_actor_names(namespace):
        try:
            handles.append(ray.get_actor(name, namespace=namespace))
        except ValueError:
            continue  # died between the listing and the lookup
    refs: list[Any] = [handle.info.remote() for handle in handles]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    infos: list[ServerInfo] = []
    for ref in ready:
        try:
            infos.append(ray.get(ref))
        except ray.exceptions.RayError:
            continue
    return sorted(infos, key=lambda info: info["node_id"])


def status(namespace: str, timeout_s: float = INFO_TIMEOUT_S) -> list[ServerStatus]:
    """One row per server actor, health as its server reports it (asked by the actor, on its node)."""
    import ray

    names = server_actor_names(namespace)
    handles: list[Any] = [ray.get_actor(name, namespace=namespace) for name in names]
    info_refs: list[Any] = [handle.info.remote() for handle in handles]
    health_refs: list[Any] = [handle.health.remote() for handle in handles]
    ray.wait(info_refs + health_refs, num_returns=len(info_refs) * 2, timeout=timeout_s)
    rows = []
    for name, info_ref, health_ref in zip(names, info_refs, health_refs, strict=True):
        try:
            info: ServerInfo = ray.get(info_ref, timeout=0)
            health: dict[str, Any] = ray.get(health_ref, timeout=0)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            from verl_sf.cluster.names import node_of

            rows.append(ServerStatus(node_id=node_of(name), node_ip="?", url=None, health="unreachable",
                                     slots=None, in_flight=None, queued=None, sessions=None, restarts=0,
                                     pid=None, fronts=None, error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        rows.append(ServerStatus(
            node_id=info["node_id"], node_ip=info["node_ip"], url=info["url"],
            health="ok" if health.get("status") == "ok" else "down", slots=health.get("workers"),
            in_flight=health.get("in_flight"), queued=health.get("queued"), sessions=_sessions(health),
            restarts=info["restarts"], pid=info["pid"], fronts=health.get("fronts"),
            error=health.get("error") or info["error"]))
    return sorted(rows, key=lambda row: row.node_id)


def _sessions(health: dict[str, Any]) -> Optional[int]:
    sessions = health.get("sessions")
    if isinstance(sessions, dict):  # {"open": n, ...} or a count
        return sessions.get("open", sessions.get("count"))
    return sessions if isinstance(sessions, int) else None


def down(namespace: str, timeout_s: float = 60.0) -> int:
    """Stop placing servers, stop every server (gracefully), and remove the actors.  Returns servers stopped."""
    import ray

    supervisor = _supervisor(namespace)
    if supervisor is not None:
        try:
            ray.get(supervisor.shutdown.remote(), timeout=INFO_TIMEOUT_S)
        except ray.exceptions.RayError:
            pass  # dead already: killing it below is all that is left
        ray.kill(supervisor, no_restart=True)
    stopped = 0
    handles: list[Any] = []
    for name in server_actor_names(namespace):
        try:
            handles.append(ray.get_actor(name, namespace=namespace))
        except ValueError:
            continue
    refs: list[Any] = [handle.stop.remote() for handle in handles]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for handle, ref in zip(handles, refs, strict=True):
        try:
            ray.get(ref, timeout=0)
            stopped += 1
        except (ray.exceptions.RayError, TimeoutError):
            pass  # unreachable: its server dies with it (parent-death signal) when the actor is killed
        ray.kill(handle, no_restart=True)
    return stopped
