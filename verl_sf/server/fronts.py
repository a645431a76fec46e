"""`verl-sf serve --fronts N`: N server processes share one port, so a node's HTTP, JSON and
pipe work runs on N cores instead of one.

Each front is a whole server (its own event loop and executor, a share of the slots and of the
queue) listening on the public port with SO_REUSEPORT: the kernel spreads connections across
them.  A session lives in one front's executor, so the front that creates it prefixes its id
with its index (`f2-<id>`), and a session call that lands on another front is forwarded over
loopback to the owner's private port (127.0.0.1, a port of its own).  Snapshots are named and
routed the same way (a session's forks and snapshots are its front's; a session started from a
snapshot is the snapshot's front's), and GET /snapshots lists every front's.  /health on any front
answers for the whole server (sums over the fronts).  If one front dies the parent stops the
others and exits non-zero: a supervisor (the cluster's node actor, systemd) restarts the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Optional

import aiohttp
import aiohttp.payload
from aiohttp import web

from verl_sf.daytona.routing import DAYTONA_PATHS, route_daytona
from verl_sf.e2b.routing import is_e2b, route_e2b
from verl_sf.errors import VerlSfError
from verl_sf.json_body import JsonBodyError, load_json_off_loop
from verl_sf.off_loop import json_bytes, off_loop
from verl_sf.server.app import CONNECTIONS_KEY, ServerConfig, build_app, run
from verl_sf.server.connections import LimitedSite
from verl_sf.server.process import die_with_parent
from verl_sf.server.relay import Peers, front_of, peer_client
from verl_sf.server.requests import EXECUTOR_KEY

log = logging.getLogger(__name__)
SESSION_ID_RE = re.compile(r"^f(\d+)-(.+)$")
SUMMED_HEALTH_FIELDS = ("slots", "sandboxes", "in_flight", "queued", "max_in_flight", "sessions", "max_sessions",
                        "snapshots", "max_snapshots", "connections", "max_connections")
OWNED_ID_FIELDS = ("session_id", "snapshot_id")
"""Fields of an answer that name a session or snapshot of the front that gave it."""
PEERS_KEY = web.AppKey("front_peers", list[int])
CLIENT_KEY = web.AppKey("front_client", aiohttp.ClientSession)
BOX_PEERS_KEY = web.AppKey("front_box_peers", Peers)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FrontsError(VerlSfError):
    """The fronts cannot start: a bad --fronts value, or a front exited while starting."""


def share(total: int, fronts: int, index: int) -> int:
    """Front `index`'s part of `total` slots (or queue places): as even as integers allow."""
    return total // fronts + (1 if index < total % fronts else 0)


def front_session_id(index: int, session_id: str) -> str:
    return f"f{index}-{session_id}"


class FrontRouting:
    """The middleware of front `index`: session calls go to the session's owner, /health sums all fronts."""

    def __init__(self, index: int, config: ServerConfig, parent: multiprocessing.connection.Connection):
        self.index = index
        self.config = config
        self.parent = parent
        self._private: Optional[web.AppRunner] = None

    def install(self, app: web.Application) -> None:
        # After the body's (routing reads bodies), before the E2B data plane's (it routes those too).
        app.middlewares.insert(1, self.middleware)
        app.on_startup.append(self._start_private)
        app.on_cleanup.append(self._stop_private)

    async def _start_private(self, app: web.Application) -> None:
        """The loopback port peers forward to, then the peer list (the public port opens after this)."""
        connections = app[CONNECTIONS_KEY]  # the process's one limit: peers' connections take files too
        private = build_app(self.config, app[EXECUTOR_KEY], connections, shared=app)
        # Compressed bodies are inflated off the loop by the body middleware (requests.py), here as on the public port.
        self._private = web.AppRunner(private, access_log=None, handle_signals=False,
                                      keepalive_timeout=self.config.timeout_keep_alive, auto_decompress=False)
        await self._private.setup()
        site = LimitedSite(self._private, "127.0.0.1", 0, connections)
        await site.start()
        self.parent.send(site.port)
        peers: list[int] = await asyncio.to_thread(self.parent.recv)
        app[PEERS_KEY] = peers
        app[CLIENT_KEY] = peer_client()
        # A sandbox stays on the front that created it; the kernel already spread the connections.
        app[BOX_PEERS_KEY] = Peers(urls=[f"http://127.0.0.1:{port}" for port in peers], own=self.index,
                                   owner=lambda ident: front_of(ident, len(peers)), placement=lambda: (self.index,))

    async def _stop_private(self, app: web.Application) -> None:
        if CLIENT_KEY in app:
            await app[CLIENT_KEY].close()
        if self._private is not None:
            await self._private.cleanup()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/health":
            return await self._health(request, handler)
        if request.path == "/snapshots" and request.method == "GET":
            return await self._all_snapshots(request, handler)
        if request.path.startswith(DAYTONA_PATHS):
            return await route_daytona(request, handler, request.app[BOX_PEERS_KEY], request.app[CLIENT_KEY])
        if is_e2b(request):
            return await route_e2b(request, handler, request.app[BOX_PEERS_KEY], request.app[CLIENT_KEY])
        owned = await _owned_id(request)
        if owned is None:
            response = await handler(request)
            if request.path == "/sessions" and request.method == "POST":
                _rewrite_ids(response, lambda local: front_session_id(self.index, local))
            return response
        kind, public_id = owned
        match = SESSION_ID_RE.match(public_id)
        peers = request.app[PEERS_KEY]
        if match is None or int(match.group(1)) >= len(peers):
            return web.json_response({"detail": f"unknown {kind} {public_id!r}: not an id this server gave out"},
                                     status=404)
        return await self._forward(request, int(match.group(1)), public_id, match.group(2))

    async def _all_snapshots(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """GET /snapshots: every front's, under their public ids (a front that does not answer is left out)."""
        response = await handler(request)
        if response.status != 200:  # listing is off
            return response
        own = _json_body(response)
        peers: list[int] = request.app[PEERS_KEY]
        others = [index for index in range(len(peers)) if index != self.index]
        answers = await asyncio.gather(*(_peer_json(request.app[CLIENT_KEY], peers[i], "/snapshots") for i in others))
        listed = [(self.index, own), *zip(others, answers, strict=True)]
        snapshots = []
        for index, answer in listed:
            for snapshot in (answer or {}).get("snapshots", []):
                _rename_ids(snapshot, functools.partial(front_session_id, index))
                snapshots.append(snapshot)
        return web.json_response({"snapshots": snapshots})

    async def _forward(self, request: web.Request, owner: int, public_id: str, local_id: str) -> web.Response:
        """Send the call, with the owner's own id, to the owner's loopback port; give the answer the public ids."""
        body = await request.read()
        field = BODY_ID_FIELDS.get(request.path)
        if field is not None:  # `_owned_id` found the id in this body, a JSON object
            payload = await load_json_off_loop(body)
            payload[field] = local_id
            body = await off_loop(len(body), json_bytes, payload)
        path = request.path.replace(public_id, local_id)
        url = f"http://127.0.0.1:{request.app[PEERS_KEY][owner]}{path}"
        async with request.app[CLIENT_KEY].request(request.method, url, data=body or None,
                                                   headers={"Content-Type": "application/json"}) as answer:
            response = web.Response(body=await answer.read(), status=answer.status,
                                    content_type=answer.content_type,
                                    headers={k: v for k, v in answer.headers.items() if k == "Retry-After"})
        _rewrite_ids(response, lambda local: front_session_id(owner, local))
        return response

    async def _health(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """This front's /health with the counters summed over every front (a peer that fails is reported)."""
        own = await handler(request)
        health = _json_body(own)
        if not isinstance(health, dict):
            return own
        client = request.app[CLIENT_KEY]
        peers: list[int] = request.app[PEERS_KEY]
        others = [port for i, port in enumerate(peers) if i != self.index]
        answers = await asyncio.gather(*(_peer_json(client, port, "/health") for port in others))
        for answer in answers:
            if answer is None:
                health["status"] = "degraded"
                continue
            for field in SUMMED_HEALTH_FIELDS:
                if isinstance(health.get(field), int) and isinstance(answer.get(field), int):
                    health[field] += answer[field]
        health["fronts"] = len(request.app[PEERS_KEY])
        health["front"] = self.index
        return web.json_response(health)


async def _peer_json(client: aiohttp.ClientSession, port: int, path: str) -> Optional[dict[str, Any]]:
    try:
        async with client.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as answer:
            body: dict[str, Any] = await answer.json()
            return body
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


BODY_ID_FIELDS = {"/run_code": "session_id", "/sessions": "from_snapshot"}
"""POST bodies that name what they address: a session to run in, a snapshot to start from."""


async def _owned_id(request: web.Request) -> Optional[tuple[str, str]]:
    """("session" | "snapshot", public id) a request addresses: `/sessions/{id}[/...]`, `/snapshots/{id}`,
    `session_id` in a /run_code body or `from_snapshot` in a POST /sessions body; None for the others."""
    for prefix, kind in (("/sessions/", "session"), ("/snapshots/", "snapshot")):
        if request.path.startswith(prefix):
            ident = request.path.split("/")[2]
            return (kind, ident) if ident else None
    field = BODY_ID_FIELDS.get(request.path)
    if request.method == "POST" and field is not None:
        raw = await request.read()  # read already, within its size and time limits (`body_middleware`)
        if f'"{field}"'.encode() in raw:
            try:
                body = await load_json_off_loop(raw)
            except JsonBodyError:
                return None  # the handler answers 400 naming the problem
            named = body.get(field) if isinstance(body, dict) else None
            if isinstance(named, str):
                return ("session" if field == "session_id" else "snapshot", named)
    return None


def _json_body(response: web.StreamResponse) -> Any:
    """A handler's JSON answer, whether it was built from bytes (json_response) or a str body; else None."""
    if not isinstance(response, web.Response) or not 200 <= response.status < 300:
        return None
    body = response.body
    if isinstance(body, aiohttp.payload.BytesPayload):  # web.Response(body=str) holds a StringPayload
        text: str | bytes = body.decode()
    elif isinstance(body, bytes):
        text = body
    else:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _rewrite_ids(response: web.StreamResponse, rename: Callable[[str], str]) -> None:
    """Give the ids in a front's answer (a session's, a fork's, a snapshot's) their public names."""
    payload = _json_body(response)
    if isinstance(payload, dict) and _rename_ids(payload, rename):
        assert isinstance(response, web.Response)
        response.body = json.dumps(payload).encode()


def _rename_ids(payload: dict[str, Any], rename: Callable[[str], str]) -> bool:
    """Rename, in place, the ids `payload` holds; whether it held any."""
    found = False
    for field in OWNED_ID_FIELDS:
        if isinstance(payload.get(field), str):
            payload[field] = rename(payload[field])
            found = True
    if isinstance(payload.get("session_ids"), list):  # a fork's answer
        payload["session_ids"] = [rename(i) if isinstance(i, str) else i for i in payload["session_ids"]]
        found = True
    return found


def _front_main(config: ServerConfig, index: int, parent: multiprocessing.connection.Connection,
                log_level: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)  # a SIGKILLed parent must not leave fronts holding the port
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s front{index} %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when fronts stop (SIGTERM)
    routing = FrontRouting(index, config, parent)
    run(config, ready=parent.send, app_hook=routing.install)


def run_fronts(config: ServerConfig, fronts: int, ready: Callable[[str], None], log_level: str = "INFO") -> int:
    """Start `fronts` servers on `config`'s port; return when they stop (0) or one died (1)."""
    if fronts < 1 or fronts > config.executor.slots:
        raise FrontsError(f"--fronts must be between 1 and --slots ({config.executor.slots}), got {fronts}")
    # Held (bound, not listening) until every front has bound the same port: `--port 0` picks it here.
    reservation = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reservation.bind((config.host, config.port))
    port = reservation.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    processes, pipes = [], []
    for index in range(fronts):
        executor = dataclasses.replace(
            config.executor, slots=share(config.executor.slots, fronts, index),
            max_in_flight=max(1, share(config.executor.max_in_flight, fronts, index)),
            max_sessions=max(1, share(config.executor.max_sessions, fronts, index)),
            max_snapshots=max(1, share(config.executor.max_snapshots, fronts, index)))
        daytona = dataclasses.replace(config.daytona, id_prefix=config.daytona.id_prefix + front_session_id(index, ""),
                                      max_sandboxes=max(1, share(config.daytona.max_sandboxes, fronts, index)))
        e2b = dataclasses.replace(config.e2b, id_prefix=config.e2b.id_prefix + front_session_id(index, ""),
                                  max_sandboxes=max(1, share(config.e2b.max_sandboxes, fronts, index)))
        front = dataclasses.replace(config, port=port, reuse_port=True, executor=executor, daytona=daytona, e2b=e2b)
        ours, theirs = context.Pipe()
        process = context.Process(target=_front_main, args=(front, index, theirs, log_level, os.getpid()),
                                  name=f"front{index}")
        process.start()
        processes.append(process)
        pipes.append(ours)
    stop = {"signal": 0}

    def request_stop(signum: int, _frame: Any) -> None:
        stop["signal"] = signum

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    try:
        private_ports = [_receive(pipe, processes) for pipe in pipes]
        for pipe in pipes:
            pipe.send(private_ports)
        for pipe in pipes:
            _receive(pipe, processes)  # the front's public URL: it listens
        reservation.close()
        ready(f"http://{config.host}:{port}")
        sentinels = [process.sentinel for process in processes]
        while not stop["signal"]:
            if multiprocessing.connection.wait(sentinels, timeout=0.5):
                log.error("a front process died; stopping the others")
                return 1
        return 0
    finally:
        reservation.close()
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the front ends its sandboxes and removes its cgroups
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()


def _receive(pipe: multiprocessing.connection.Connection, processes: list[Any]) -> Any:
    """The next message of a starting front, or FrontsError if any front died first."""
    while not pipe.poll(0.5):
        dead = [p.name for p in processes if not p.is_alive()]
        if dead:
            raise FrontsError(f"front process(es) {', '.join(dead)} exited while starting")
    return pipe.recv()
