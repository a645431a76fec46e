"""aiohttp application: /run_code, /run_jupyter, /v1/ping, /sessions (fork, snapshot), /snapshots, /health,
/metrics, and verl-tool's /get_observation; `serve` runs it behind the connection limit.

Error bodies follow FastAPI's shape (`{"detail": ...}`); see `verl_sf.server.requests`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Optional, Union

import uvloop
from aiohttp import web

from verl_sf import __version__
from verl_sf.byte_budget import BODIES_KEY, body_budget
from verl_sf.daytona import DAYTONA_SANDBOXES_KEY, DaytonaConfig, install_daytona
from verl_sf.e2b import SANDBOXES_KEY, E2BConfig, install_e2b
from verl_sf.errors import SessionGone
from verl_sf.executor import Executor, ExecutorConfig, closed
from verl_sf.executor.child_process import adopt_orphans
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse, SessionCreateRequest
from verl_sf.server.connections import ConnectionLimit, LimitedSite, connection_cap, raise_open_files_limit
from verl_sf.server.fleet import FleetMember, FleetRouting
from verl_sf.server.metrics import ServerMetrics
from verl_sf.server.rejections import REFUSALS, refuse
from verl_sf.server.requests import (
    EXECUTOR_KEY,
    METRICS_KEY,
    RequestT,
    body_middleware,
    get_executor,
    get_metrics,
    model_answer,
    parse,
    run_answer,
)
from verl_sf.server.snapshot_routes import add_snapshot_routes
from verl_sf.server.verl_tool_routes import add_verl_tool_routes
from verl_sf.verl_tool import VerlToolConfig

log = logging.getLogger(__name__)
CONNECTIONS_KEY = web.AppKey("connections", ConnectionLimit)


@dataclasses.dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_mb: int = 64
    """Larger request bodies get 413 before any of them is parsed."""
    max_bodies_mb: int = 1024
    """Request bodies a server process holds at once (read, their answers not yet sent); a body past
    it gets 503 with Retry-After (one body alone always fits)."""
    timeout_keep_alive: float = 20.0
    """Seconds a connection may take, from its opening or its last reply, to deliver a whole request
    header: idle keep-alive connections and slow headers are closed after it (longer than the 15 s
    for which aiohttp's and most clients' pools keep an idle connection, so the client lets go first)."""
    timeout_body: float = 30.0
    """Seconds a request body may take to arrive after its header; a slower one gets 408."""
    max_connections: Optional[int] = None
    """Open connections per server process; None: as many as the open-files limit leaves room for."""
    retry_after_s: int = 1
    list_snapshots: bool = False
    """Answer GET /snapshots with every snapshot's id: ids are what lets a client start sessions from a
    snapshot or delete it, so only for servers whose clients all trust one another."""
    reuse_port: bool = False
    """Share the port with other processes (SO_REUSEPORT): `verl-sf serve --fronts N` runs N."""
    executor: ExecutorConfig = dataclasses.field(default_factory=ExecutorConfig)
    verl_tool: VerlToolConfig = dataclasses.field(default_factory=VerlToolConfig)
    e2b: E2BConfig = dataclasses.field(default_factory=E2BConfig)
    daytona: DaytonaConfig = dataclasses.field(default_factory=DaytonaConfig)
    fleet: Optional[FleetMember] = None
    """A `verl-sf cluster` fleet's server: E2B and Daytona sandboxes are reached through any of them."""

    def __post_init__(self) -> None:
        for name in ("timeout_keep_alive", "timeout_body"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections!r}")


async def _execute(request: web.Request, model: type[RequestT], endpoint: str, language: Callable[[RequestT], str],
                   run: Callable[[RequestT], Awaitable[Union[RunCodeResponse, RunJupyterResponse]]],
                   ) -> web.StreamResponse:
    parsed = await parse(request, model)
    if isinstance(parsed, web.Response):
        return parsed
    started = time.monotonic()
    try:
        response = await run(parsed)
    except REFUSALS as exc:
        return refuse(request, exc)
    get_metrics(request).record_run(endpoint, language(parsed), response.status, response.queue_wait,
                                    time.monotonic() - started)
    return await run_answer(request, response)


async def create_session(request: web.Request) -> web.Response:
    parsed = await parse(request, SessionCreateRequest)
    if isinstance(parsed, web.Response):
        return parsed
    try:
        info = await get_executor(request).create_session(parsed)
    except REFUSALS as exc:  # a field that clashes with a snapshot is 422, as pydantic's would be
        return refuse(request, exc, invalid_status=400 if parsed.from_snapshot is None else 422)
    return await model_answer(info, 201)


async def get_session(request: web.Request) -> web.Response:
    try:
        info = get_executor(request).session_info(request.match_info["session_id"])
    except SessionGone as exc:
        return refuse(request, exc)
    return await model_answer(info)


async def delete_session(request: web.Request) -> web.Response:
    try:
        await closed(get_executor(request).end_session(request.match_info["session_id"]))
    except SessionGone as exc:
        return refuse(request, exc)
    return web.json_response({"session_id": request.match_info["session_id"], "ended": True})


async def run_code(request: web.Request) -> web.StreamResponse:
    return await _execute(request, RunCodeRequest, "run_code", lambda r: r.language, get_executor(request).run_code)


async def run_jupyter(request: web.Request) -> web.StreamResponse:
    return await _execute(request, RunJupyterRequest, "run_jupyter", lambda r: "python",
                          get_executor(request).run_jupyter)


async def ping(request: web.Request) -> web.Response:
    return web.json_response("pong")


async def health(request: web.Request) -> web.Response:
    status = get_executor(request).status()
    faults = status.faults  # a sandbox whose reader failed is not ok until it answers again
    return web.json_response(status=503 if faults else 200, data={
        "status": "unhealthy" if faults else "ok",
        "faults": faults,
        "version": __version__,
        **status.health(),
        "connections": request.app[CONNECTIONS_KEY].open,
        "max_connections": request.app[CONNECTIONS_KEY].maximum,
    })


async def metrics(request: web.Request) -> web.Response:
    registry = get_metrics(request)
    return web.Response(body=registry.render(), headers={"Content-Type": registry.content_type})


def build_app(config: ServerConfig, executor: Executor, connections: ConnectionLimit,
              shared: Optional[web.Application] = None) -> web.Application:
    """The app around a started executor (the caller owns the executor's lifecycle); `connections`
    is the limit of the process the app's sites count their connections in (`LimitedSite`);
    `shared`: another app on the same executor whose E2B and Daytona sandboxes this one serves too
    (a front's loopback app), else it has its own."""
    bodies = body_budget(max(config.max_bodies_mb, config.max_body_mb) << 20)
    app = web.Application(client_max_size=config.max_body_mb << 20,
                          middlewares=[body_middleware(config.timeout_body, bodies)])
    app[EXECUTOR_KEY] = executor
    app[BODIES_KEY] = bodies
    app[CONNECTIONS_KEY] = connections
    app[METRICS_KEY] = ServerMetrics(executor, connections)
    app["retry_after_s"] = config.retry_after_s
    app["max_body_bytes"] = config.max_body_mb << 20
    app.router.add_post("/run_code", run_code)
    app.router.add_post("/run_jupyter", run_jupyter)
    app.router.add_get("/v1/ping", ping)
    app.router.add_post("/sessions", create_session)
    app.router.add_get("/sessions/{session_id}", get_session)
    app.router.add_delete("/sessions/{session_id}", delete_session)
    add_snapshot_routes(app, config.list_snapshots)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    add_verl_tool_routes(app, config.verl_tool)
    install_e2b(app, executor, config.e2b, shared[SANDBOXES_KEY] if shared else None)
    install_daytona(app, executor, config.daytona, shared[DAYTONA_SANDBOXES_KEY] if shared else None)
    return app


async def serve(config: ServerConfig, ready: Optional[Callable[[str], None]] = None,
                app_hook: Optional[Callable[[web.Application], None]] = None) -> None:
    """Run until SIGTERM/SIGINT; `ready` gets the base URL once the port is bound; `app_hook`
    may add middlewares and startup steps to the app before it starts (the fronts' routing)."""
    _protect_from_oom_killer()
    connections = ConnectionLimit(connection_cap(config.max_connections, raise_open_files_limit()),
                                  config.retry_after_s, config.timeout_keep_alive)
    executor = Executor(config.executor)
    await executor.start()
    # Long-lived objects (modules, the app) leave the collector's view: full collections
    # otherwise rescan them every few thousand requests (~13% of server CPU under load).
    gc.collect()
    gc.freeze()
    # A client that disconnects cancels its handler: its queued run is dropped, its running one killed.
    app = build_app(config, executor, connections)
    if app_hook:
        app_hook(app)
    if config.fleet is not None:
        FleetRouting(config.fleet).install(app)  # inserted last, so it runs before the fronts' routing

    async def end_runs(_: web.Application) -> None:
        await executor.close()

    # Stopping closes the port, then the executor: what is in flight is answered at once ("the server
    # is shutting down", a sandbox error), where aiohttp would wait up to a minute for each handler.
    app.on_shutdown.append(end_runs)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                           keepalive_timeout=config.timeout_keep_alive, auto_decompress=False)  # requests.py inflates
    try:
        await runner.setup()
        site = LimitedSite(runner, config.host, config.port, connections, backlog=4096, reuse_port=config.reuse_port)
        await site.start()
        url = f"http://{config.host}:{site.port}"
        if ready:
            ready(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        await executor.close()


def run(config: ServerConfig, ready: Optional[Callable[[str], None]] = None,
        app_hook: Optional[Callable[[web.Application], None]] = None) -> None:
    """`serve` on uvloop's event loop: its transports and loop cost the server less CPU per request
    than asyncio's own (docs/performance.md).  But libuv aborts the process when epoll_ctl fails, and
    the kernel's epoll-watch count is per uid: as an ordinary account, whose runs are its uid, one run
    exhausting it killed the server; asyncio's loop refuses the one connection instead.  The server
    adopts what a dead zygote's runs leave."""
    adopt_orphans()
    if os.geteuid() == 0:  # runs are other uids
        uvloop.run(serve(config, ready, app_hook))
    else:
        asyncio.run(serve(config, ready, app_hook))


def _protect_from_oom_killer() -> None:
    """Under memory pressure the kernel kills runs (oom_score_adj 1000), never the server."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("-900")
    except OSError:
        log.info("verl-sf: cannot lower this server's oom_score_adj (needs CAP_SYS_RESOURCE); runs still go first")
