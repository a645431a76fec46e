"""Driver-side fleet operations: up, status, down, and the server list the router reads.

These run in any process connected to Ray (the `verl-sf cluster` CLI, a training driver,
the `cluster` backend).  Nothing is stored outside Ray: the named actors are the fleet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from typing import Any, Optional, cast

from verl_sf.cluster.names import DEFAULT_NAMESPACE, SUPERVISOR_NAME, node_of
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
    isolation: Optional[str] = None  # the rung the server isolates with


_CONNECTING = threading.Lock()  # the cluster backend connects from each event loop's thread


def connect(address: Optional[str] = None, namespace: str = DEFAULT_NAMESPACE) -> None:
    """Join the Ray cluster as Ray's own commands do: `address`, else RAY_ADDRESS, else `auto`."""
    import ray

    with _CONNECTING:
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
        supervisor = ray.remote(FleetSupervisor).options(
            name=SUPERVISOR_NAME, namespace=namespace, get_if_exists=True, lifetime="detached",
            max_restarts=-1, max_task_retries=-1, num_cpus=0,
        ).remote(namespace, resource, list(serve_args), poll_s)
    deadline = time.monotonic() + timeout_s
    nodes = ray.get(supervisor.reconcile.remote(), timeout=timeout_s)
    if not nodes:
        raise FleetError(f"no live Ray node carries the resource {resource!r}" if resource
                         else "the Ray cluster has no live node")
    while True:  # until each node's server answers, or its start failed
        rows = status(namespace, timeout_s=max(1.0, deadline - time.monotonic()))
        errors = ray.get(supervisor.start_errors.remote(), timeout=INFO_TIMEOUT_S)
        failed = {node: error for node, error in errors.items() if node in nodes}
        answering = {row.node_id for row in rows if row.health == "ok"}
        if set(nodes) <= answering | set(failed) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if failed:
        why = "; ".join(f"the server on node {node} did not start: {error}" for node, error in failed.items())
        raise FleetError(f"{why} (the fleet tries again, less and less often: `verl-sf cluster down` stops it)")
    return rows


def _server_actors(namespace: str) -> list[tuple[str, Any]]:
    """(name, handle) of every server actor; a name that went away since the listing is skipped."""
    import ray

    actors = []
    for name in server_actor_names(namespace):
        try:
            actors.append((name, ray.get_actor(name, namespace=namespace)))
        except ValueError:
            continue
    return actors


def _results(refs: list[Any], timeout_s: float) -> list[Any]:
    """Each ref's value, or the RayError standing for it (GetTimeoutError if it did not finish in time)."""
    import ray

    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    results: list[Any] = []
    for ref in refs:
        try:
            results.append(ray.get(ref, timeout=0))
        except ray.exceptions.RayError as exc:
            results.append(exc)
    return results


def server_infos(namespace: str, timeout_s: float = INFO_TIMEOUT_S) -> list[ServerInfo]:
    """Every server actor's `info()`; actors that do not answer in time (restarting, node gone) are left out."""
    answers = _results([handle.info.remote() for _, handle in _server_actors(namespace)], timeout_s)
    infos = [cast(ServerInfo, answer) for answer in answers if isinstance(answer, dict)]
    return sorted(infos, key=lambda info: info["node_id"])


def status(namespace: str, timeout_s: float = INFO_TIMEOUT_S) -> list[ServerStatus]:
    """One row per server actor, health as its server reports it (asked by the actor, on its node)."""
    actors = _server_actors(namespace)
    answers = _results([ref for _, handle in actors for ref in (handle.info.remote(), handle.health.remote())],
                       timeout_s)
    rows = []
    for (name, _), info, health in zip(actors, answers[0::2], answers[1::2], strict=True):
        if not isinstance(info, dict) or not isinstance(health, dict):
            error = info if isinstance(info, Exception) else health
            rows.append(ServerStatus(node_id=node_of(name), node_ip="?", url=None, health="unreachable",
                                     slots=None, in_flight=None, queued=None, sessions=None, restarts=0,
                                     pid=None, fronts=None, error=f"{type(error).__name__}: {error}"[:200]))
            continue
        rows.append(ServerStatus(
            node_id=info["node_id"], node_ip=info["node_ip"], url=info["url"],
            health="ok" if health.get("status") == "ok" else "down", slots=health.get("slots"),
            in_flight=health.get("in_flight"), queued=health.get("queued"), sessions=_sessions(health),
            restarts=info["restarts"], pid=info["pid"], fronts=health.get("fronts"),
            error=health.get("error") or info["error"], isolation=health.get("isolation")))
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
        with contextlib.suppress(ray.exceptions.RayError):  # dead already: killing it below is all that is left
            ray.get(supervisor.shutdown.remote(), timeout=INFO_TIMEOUT_S)
        ray.kill(supervisor, no_restart=True)
    actors = _server_actors(namespace)
    outcomes = _results([handle.stop.remote() for _, handle in actors], timeout_s)
    for _, handle in actors:
        # One that did not stop in time is killed: its server dies with it (parent-death signal).
        ray.kill(handle, no_restart=True)
    return sum(1 for outcome in outcomes if not isinstance(outcome, Exception))
