"""`ClusterSandboxBackend`: the fleet `verl-sf cluster up` placed, routed from the caller's own node.

Servers are found through Ray (the fleet's named actors); calls go straight to a server over
HTTP with the http backend's client.  Routing, per call:

1. the caller's own node's server (same Ray node id; outside Ray, same IP): no network hop;
2. when it is absent or saturated (it answered 503/429 within the last `busy_s`, or this
   process already has `spill_at` calls in flight on it), the other server with the fewest of
   this process's calls in flight per slot.

A server that cannot be connected to never ran the call: the call goes to the next server and
the directory is refreshed (Ray restarts servers, on the same URL when it can).  A connection
that breaks after the request was sent may have run the code: it is not re-sent (a run is not
idempotent) and the caller gets `SandboxCallInterrupted`, a `SandboxUnavailable` (a sandbox
failure, never the code's verdict).  Sessions are the backends' own (`run_code(request,
session=key)`, as for http and local): a session lives on the server that created it; when that
server has died or no longer knows the session, the call raises `SessionGone`.  A session's forks
and snapshots live on its server, and a session opened from a snapshot on the snapshot's (a
snapshot another process took is found by asking each server); a snapshot whose server has died or
forgotten it raises `SnapshotGone`.

The object holds only its settings when pickled; its state (directory, counters, sessions)
belongs to the process and event loop that use it, as the http backend's connections do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Optional, TypeVar

from pydantic import Field, field_validator

from verl_sf.backends.base import BackendConfigBase, SandboxUnavailable
from verl_sf.backends.http import (
    HttpBackendConfig,
    HttpSandboxBackend,
    SandboxConnectionLost,
    SandboxOverloaded,
    SandboxRequestRejected,
    SandboxUnreachable,
)
from verl_sf.backends.sessions import ServerSessionBackend
from verl_sf.detached import detached_task
from verl_sf.errors import SessionGone, SnapshotGone
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreateRequest,
    SessionForkRequest,
    SessionInfo,
    SnapshotInfo,
)

log = logging.getLogger(__name__)
RECHECK_DOWN_S = 1.0
T = TypeVar("T")


class SandboxCallInterrupted(SandboxUnavailable):
    """The server's connection broke while the call may have been running; it was not re-sent."""


class ClusterBackendConfig(BackendConfigBase):
    """`backend: cluster`: the fleet of `verl-sf cluster up`, found through Ray; the yaml's `cluster:` block."""

    type: Literal["cluster"] = "cluster"
    address: Optional[str] = None
    """Ray cluster to join when this process is not connected yet (default: RAY_ADDRESS, else auto)."""
    namespace: str = "verl-sf-cluster"
    """Ray namespace of the fleet (`verl-sf cluster up --namespace`)."""
    refresh_s: float = Field(10.0, ge=0)
    """How often the server list is re-read from Ray (sooner after a server fails)."""
    spill_at: Optional[int] = Field(None, ge=1)
    """This process's calls in flight on its node's server at which further calls go elsewhere
    (default: that server's slot count)."""
    busy_s: float = Field(0.5, ge=0)
    """How long a server that answered 503/429 is passed over."""
    max_rounds: int = Field(5, ge=1)
    """Passes over the servers before a call gives up (jittered backoff in between)."""
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    http: dict[str, Any] = Field(default_factory=dict)
    """HttpBackendConfig options for the calls (connect_timeout_s, server_margin_s, connection_limit)."""

    @field_validator("http")
    @classmethod
    def _http_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "max_retries" in value or "url" in value:
            raise ValueError("url and max_retries do not apply: the fleet's servers are found through Ray, and a "
                             "call a server declines or cannot take goes to another one (max_rounds bounds that)")
        HttpBackendConfig(url="http://127.0.0.1", **value)  # names a bad option now, not at the first call
        return value

    def build(self) -> ClusterSandboxBackend:
        return ClusterSandboxBackend(self)


@dataclasses.dataclass
class _Server:
    node_id: str
    node_ip: str
    url: str
    generation: int
    client: HttpSandboxBackend
    slots: int = 1
    in_flight: int = 0  # this process's calls on it
    served: int = 0
    busy_until: float = 0.0  # monotonic: declined a call (503/429) until then
    down: bool = False  # refused a connection; skipped until the directory is refreshed


@dataclasses.dataclass
class _State:
    """Per event loop: servers by URL, sessions and snapshots by id, and when the directory was last read."""

    servers: dict[str, _Server] = dataclasses.field(default_factory=dict)
    sessions: dict[str, str] = dataclasses.field(default_factory=dict)  # session id -> its server's URL
    snapshots: dict[str, str] = dataclasses.field(default_factory=dict)  # snapshot id -> its server's URL
    refreshed_at: float = float("-inf")
    refreshing: Optional[asyncio.Future] = None


@dataclasses.dataclass(frozen=True)
class _Held:
    """What lives on one server and is routed there: sessions, snapshots."""

    path: str  # the server's route, /{path}/{id}, and the `_State` table that maps ids to servers
    gone: type[SessionGone] | type[SnapshotGone]

    def table(self, state: _State) -> dict[str, str]:
        table: dict[str, str] = getattr(state, self.path)
        return table


SESSIONS = _Held("sessions", SessionGone)
SNAPSHOTS = _Held("snapshots", SnapshotGone)


class ClusterSandboxBackend(ServerSessionBackend):
    """Routes every call to a server of the Ray-placed fleet: its own node's first; a session's calls to its server."""

    name = "cluster"

    def __init__(self, config: Optional[ClusterBackendConfig] = None, **options: Any):
        """`ClusterSandboxBackend(ClusterBackendConfig(...))`, or the shorthand `ClusterSandboxBackend(**options)`."""
        if config is not None and options:
            raise TypeError(f"options {sorted(options)} go into the ClusterBackendConfig, not beside it")
        super().__init__()
        self.config = config or ClusterBackendConfig(**options)
        self._states: dict[asyncio.AbstractEventLoop, _State] = {}
        self._node: Optional[tuple[str, str]] = None

    def __repr__(self) -> str:
        return f"ClusterSandboxBackend(namespace={self.config.namespace!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_states"], state["_node"] = {}, None
        return state

    async def __aenter__(self) -> ClusterSandboxBackend:
        await self._refresh(force=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the SandboxBackend interface ------------------------------------------------
    async def _run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        """Run `request` in the server session `request.session_id` names (on its server), else on the best server."""
        if request.session_id:
            return await self._in_session(request.session_id, lambda server: server.client.run_code(request))
        return await self._routed(lambda server: server.client.run_code(request))

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        return await self._routed(lambda server: server.client.run_jupyter(request))

    async def close(self) -> None:
        """End the sessions this object created, then close its connections on the running loop."""
        await self._end_all_sessions()
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None and state.servers:
            await next(iter(state.servers.values())).client.close()  # one shared connection pool

    # ---- sessions (the server's HTTP session API, on the server that holds each) ---------
    async def _create_session(self, request: SessionCreateRequest) -> SessionInfo:
        """`POST /sessions` on the server a call would go to now (from a snapshot: on the snapshot's);
        remembers where the session lives."""
        snapshot = request.from_snapshot
        if snapshot is None:
            return await self._routed(lambda server: self._record(server, server.client._create_session(request)))
        return await self._on_owner(SNAPSHOTS, snapshot,
                                    lambda server: self._record(server, server.client._create_session(request)))

    async def _delete_session(self, session_id: str) -> None:
        """`DELETE /sessions/{id}`; a session that is already gone, or whose server is, counts as ended."""
        with contextlib.suppress(SessionGone):
            await self._in_session(session_id, lambda server: server.client.request_json(
                "DELETE", f"/sessions/{session_id}"))
        self._state().sessions.pop(session_id, None)

    async def _fork_session(self, session_id: str, request: SessionForkRequest) -> list[str]:
        """The forks live on the parent's server."""
        return await self._in_session(session_id, lambda server: self._record(
            server, server.client._fork_session(session_id, request)))

    async def _snapshot_session(self, session_id: str) -> SnapshotInfo:
        """The snapshot lives on the session's server."""
        return await self._in_session(session_id, lambda server: self._record(
            server, server.client._snapshot_session(session_id)))

    async def _delete_snapshot(self, snapshot_id: str) -> None:
        """A snapshot that is already gone, or whose server is, counts as deleted."""
        with contextlib.suppress(SnapshotGone):
            await self._on_owner(SNAPSHOTS, snapshot_id, lambda server: server.client._delete_snapshot(snapshot_id))
        self._state().snapshots.pop(snapshot_id, None)

    async def _record(self, server: _Server, made: Awaitable[T]) -> T:
        """What `made` created (a session, forks, a snapshot), remembered as living on `server`."""
        result = await made
        state = self._state()
        if isinstance(result, SessionInfo):
            state.sessions[result.session_id] = server.url
        elif isinstance(result, SnapshotInfo):
            state.snapshots[result.snapshot_id] = server.url
        elif isinstance(result, list):
            state.sessions.update(dict.fromkeys(result, server.url))
        return result

    # ---- what the router sees --------------------------------------------------------
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per server URL, as this process sees it: node, calls served and in flight, state."""
        state = self._states.get(asyncio.get_running_loop(), _State())
        local = self._node_identity()[0] if self._node else None
        return {url: {"node_id": s.node_id, "local": s.node_id == local, "served": s.served,
                      "in_flight": s.in_flight, "slots": s.slots, "down": s.down} for url, s in state.servers.items()}

    def session_server(self, session_id: str) -> Optional[str]:
        """The URL of the server this process knows the server session `session_id` lives on."""
        return self._states.get(asyncio.get_running_loop(), _State()).sessions.get(session_id)

    def snapshot_server(self, snapshot_id: str) -> Optional[str]:
        """The URL of the server this process knows snapshot `snapshot_id` lives on."""
        return self._states.get(asyncio.get_running_loop(), _State()).snapshots.get(snapshot_id)

    async def servers(self) -> list[str]:
        """URLs of the servers the directory holds (refreshed if stale)."""
        await self._refresh()
        return sorted(self._state().servers)

    # ---- routing ---------------------------------------------------------------------
    async def _routed(self, call: Any) -> Any:
        """Run `call(server)` on the best server; fail over on refusal or 503; never re-send a lost call."""
        reasons: list[str] = []
        for round_ in range(self.config.max_rounds):
            await self._refresh(force=round_ > 0)
            tried: set[str] = set()
            while (server := self._pick(tried)) is not None:
                tried.add(server.url)
                server.in_flight += 1
                try:
                    result = await call(server)
                except SandboxUnreachable as exc:
                    self._mark_down(server)
                    reasons.append(str(exc))
                    continue
                except SandboxOverloaded as exc:
                    server.busy_until = time.monotonic() + self.config.busy_s
                    reasons.append(str(exc))
                    continue
                except SandboxConnectionLost as exc:
                    raise SandboxCallInterrupted(
                        f"{server.url} dropped the connection after the call was sent; the run may have "
                        f"started, so it was not re-sent to another server: {exc}") from exc
                finally:
                    server.in_flight -= 1
                server.served += 1
                return result
            if round_ + 1 < self.config.max_rounds:
                backoff = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** round_)
                await asyncio.sleep(random.uniform(0, backoff))
        if not reasons:
            raise SandboxUnavailable(f"no sandbox server in Ray namespace {self.config.namespace!r} "
                                     f"(is the fleet up? `verl-sf cluster up`)")
        raise SandboxUnavailable(f"no server took the call in {self.config.max_rounds} round(s); "
                                 f"last: {reasons[-1]}")

    def _pick(self, tried: set[str]) -> Optional[_Server]:
        candidates = [s for s in self._state().servers.values() if s.url not in tried and not s.down]
        if not candidates:
            return None
        now = time.monotonic()
        node_id, node_ip = self._node_identity()
        if any(s.node_id == node_id for s in self._state().servers.values()):
            local = [s for s in candidates if s.node_id == node_id]
        else:  # a process outside the fleet's nodes (e.g. a Ray client): its host's server is local
            local = [s for s in candidates if s.node_ip == node_ip]

        def saturated(server: _Server) -> bool:
            return server.busy_until > now or server.in_flight >= (self.config.spill_at or server.slots)

        for server in local:
            if not saturated(server):
                return server
        return min(candidates, key=lambda s: (saturated(s), s.in_flight / s.slots, s.node_id != node_id))

    async def _in_session(self, session_id: str, call: Callable[[_Server], Awaitable[T]]) -> T:
        return await self._on_owner(SESSIONS, session_id, call)

    async def _on_owner(self, held: _Held, ident: str, call: Callable[[_Server], Awaitable[T]]) -> T:
        """`call(server)` on the server that holds session or snapshot `ident`; `held.gone` when it is not there."""
        state = self._state()
        table = held.table(state)
        url = table.get(ident) or await self._find(held, ident)
        server = state.servers.get(url)
        if server is None:
            await self._refresh(force=True)
            server = state.servers.get(url)
            if server is None:
                raise held.gone(ident, f"its server {url} is no longer in the fleet")
        server.in_flight += 1
        try:
            result = await call(server)
        except (SandboxUnreachable, SandboxConnectionLost) as exc:
            self._mark_down(server)
            table.pop(ident, None)
            raise held.gone(ident, f"its server {url} died: {exc}") from exc
        except (SandboxRequestRejected, held.gone) as exc:
            if isinstance(exc, SandboxRequestRejected) and exc.status != 404:
                raise
            table.pop(ident, None)
            said = exc.body if isinstance(exc, SandboxRequestRejected) else exc.reason
            raise held.gone(ident, f"{url} does not know it (ended, expired, or the server restarted): "
                                   f"{said}") from exc
        finally:
            server.in_flight -= 1
        server.served += 1
        return result

    def _mark_down(self, server: _Server) -> None:
        """Skip it, and read the directory again soon: Ray restarts servers within seconds."""
        server.down = True
        state = self._state()
        state.refreshed_at = min(state.refreshed_at, time.monotonic() - self.config.refresh_s + RECHECK_DOWN_S)

    async def _find(self, held: _Held, ident: str) -> str:
        """A session or snapshot another process created: ask each server (`GET /sessions/{id}`) once."""
        await self._refresh()
        for server in list(self._state().servers.values()):
            try:
                await server.client.request_json("GET", f"/{held.path}/{ident}")
            except (SandboxUnavailable, SandboxRequestRejected):
                continue
            held.table(self._state())[ident] = server.url
            return server.url
        raise held.gone(ident, "no server of the fleet knows it")

    # ---- the directory (Ray's named actors) ------------------------------------------
    def _state(self) -> _State:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            for closed in [other for other in self._states if other.is_closed()]:
                del self._states[closed]
            state = self._states[loop] = _State()
        return state

    def _node_identity(self) -> tuple[str, str]:
        """(Ray node id, IP) of this process: which server is "local"."""
        if self._node is None:
            import ray

            self._node = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())
        return self._node

    async def _refresh(self, force: bool = False) -> None:
        state = self._state()
        if not force and time.monotonic() - state.refreshed_at < self.config.refresh_s and state.servers:
            return
        if state.refreshing is None:  # one refresh at a time; concurrent callers wait for it
            state.refreshing = detached_task(self._read_directory(state))  # shared: no caller's cancel ends it
        refreshing = state.refreshing
        try:
            await asyncio.shield(refreshing)
        except Exception as exc:
            if isinstance(exc, SandboxUnavailable):
                raise
            raise SandboxUnavailable(f"cannot read the sandbox fleet from Ray (namespace {self.config.namespace!r}): "
                                     f"{type(exc).__name__}: {exc}") from exc
        finally:
            if state.refreshing is refreshing and refreshing.done():
                state.refreshing = None

    async def _read_directory(self, state: _State) -> None:
        from verl_sf.cluster import fleet

        await asyncio.to_thread(fleet.connect, self.config.address, self.config.namespace)
        self._node_identity()
        infos = await asyncio.to_thread(fleet.server_infos, self.config.namespace)
        fresh: dict[str, _Server] = {}
        new: list[_Server] = []
        for info in infos:
            url = info["url"]
            if url is None:
                continue  # restarting: not routable until it listens again
            known = state.servers.get(url)
            if known is not None and known.generation == info["generation"] and known.node_id == info["node_id"]:
                known.down = False
                fresh[url] = known
                continue
            client = HttpSandboxBackend(url, **self.config.http, max_retries=0)
            fresh[url] = _Server(info["node_id"], info["node_ip"], url, info["generation"], client)
            new.append(fresh[url])
        await asyncio.gather(*(self._read_slots(server) for server in new))
        state.servers = fresh
        state.refreshed_at = time.monotonic()

    @staticmethod
    async def _read_slots(server: _Server) -> None:
        """The server's slot count from its /health: the default spill threshold and load scale."""
        try:
            health = await server.client.request_json("GET", "/health", budget_s=5.0)
            server.slots = max(1, int(health.get("slots", 1)))
        except (SandboxUnavailable, SandboxRequestRejected, TypeError, ValueError) as exc:
            log.warning("cluster backend: no /health from %s: %s", server.url, exc)
