"""The E2B API under `verl-sf serve --fronts N`: every call reaches the front that holds its sandbox.

A sandbox lives in the executor of the front that created it, and its id says which (`f{i}-i...`).
Its data plane (the `E2b-Sandbox-Id` header) and its control-plane calls (`/sandboxes/{id}/...`)
are relayed to that front's loopback port when they land elsewhere, streams as streams; the list
merges every front's sandboxes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from verl_sf.server.relay import front_of, peer_json, relay

CONTROL_PATHS = ("/sandboxes", "/v2/sandboxes")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_e2b(request: web.Request) -> bool:
    return "E2b-Sandbox-Id" in request.headers or request.path.startswith(CONTROL_PATHS)


async def route_e2b(request: web.Request, handler: Handler, index: int, peers: list[int],
                    client: aiohttp.ClientSession) -> web.StreamResponse:
    ident = request.headers.get("E2b-Sandbox-Id")
    if ident is None:
        parts = request.path.split("/")[2 if request.path.startswith("/sandboxes") else 3:]  # id, action...
        if not parts or not parts[0]:
            if request.method == "GET":
                return await _list_all(request, peers, client)
            return await handler(request)  # a creation: this front's
        ident = parts[0]
    owner = front_of(ident, len(peers))
    if owner is None or owner == index:
        return await handler(request)
    return await relay(request, peers[owner], client)


async def _list_all(request: web.Request, peers: list[int], client: aiohttp.ClientSession) -> web.Response:
    """GET /sandboxes over every front: their sandboxes merged in start order, then paged here as E2B pages."""
    params = {k: v for k, v in request.query.items() if k not in ("limit", "nextToken")}
    answers = await asyncio.gather(*(peer_json(client, port, request, request.path, params) for port in peers))
    if any(answer is None for answer, _ in answers):
        return web.json_response({"code": 503, "message": "a front of this server did not answer the list"},
                                 status=503)
    sandboxes = sorted((s for answer, _ in answers if answer is not None for s in answer),
                       key=lambda s: s.get("startedAt", ""))
    token, limit = request.query.get("nextToken", "0"), request.query.get("limit", "")
    start = int(token) if token.isdigit() else 0
    count = int(limit) if limit.isdigit() and int(limit) > 0 else len(sandboxes)
    headers = {"X-Next-Token": str(start + count)} if start + count < len(sandboxes) else {}
    return web.json_response(sandboxes[start:start + count], headers=headers)
