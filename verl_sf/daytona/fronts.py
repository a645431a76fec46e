"""The Daytona API under `verl-sf serve --fronts N`: every call reaches the front that holds its sandbox.

A sandbox lives in the executor of the front that created it, and its id says which (`f{i}-...`).
A call on an id another front holds is relayed to that front's loopback port (HTTP as it came, the
interpreter's websocket frame by frame, the `Host` kept so answers name the public URL); a call on
a sandbox's name asks every front which holds it.  The list merges every front's sandboxes, and a
new name is checked against every front first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Optional

import aiohttp
from aiohttp import web

from verl_sf.daytona.control import API, LIST_LIMIT, TOOLBOX
from verl_sf.daytona.wire import error
from verl_sf.server.relay import FRONT_ID, front_of, peer_json, relay

DAYTONA_PATHS = (f"{API}/sandbox", TOOLBOX)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def route_daytona(request: web.Request, handler: Handler, index: int, peers: list[int],
                        client: aiohttp.ClientSession) -> web.StreamResponse:
    parts = request.path.split("/")  # ["", "api", "sandbox" | "toolbox", id-or-name, ...]
    if len(parts) < 4 or not parts[3]:
        if request.method == "GET" and request.path == f"{API}/sandbox":
            return await _list_all(request, peers, client)
        if request.method == "POST" and request.path == f"{API}/sandbox":
            taken = await _name_taken(request, peers, client)
            if taken is not None:
                return taken
        return await handler(request)
    owner = await _owner(request, parts[3], index, peers, client)
    if owner is None or owner == index:
        return await handler(request)
    return await relay(request, peers[owner], client)


async def _owner(request: web.Request, ident: str, index: int, peers: list[int],
                 client: aiohttp.ClientSession) -> Optional[int]:
    """The front holding the sandbox `ident` (an id, or a name any front may hold); None: let this one answer."""
    if FRONT_ID.match(ident) is not None:
        return front_of(ident, len(peers))
    answers = await asyncio.gather(*(peer_json(client, port, request, f"{API}/sandbox/{ident}") for port in peers))
    found = [front for front, (answer, _) in enumerate(answers) if answer is not None]
    return found[0] if found else None


async def _list_all(request: web.Request, peers: list[int], client: aiohttp.ClientSession) -> web.Response:
    """GET /api/sandbox over every front: their sandboxes merged in creation order, then paged here."""
    start = request.query.get("cursor") or "0"
    limit = request.query.get("limit") or str(LIST_LIMIT)
    if not start.isdigit() or not limit.isdigit() or int(limit) < 1:
        return error(400, "cursor, limit: a cursor this server gave, and a positive integer")
    params = {k: v for k, v in request.query.items() if k not in ("cursor", "limit")}
    answers = await asyncio.gather(*(peer_json(client, port, request, f"{API}/sandbox",
                                               {**params, "limit": "1000000"}) for port in peers))
    if any(answer is None for answer, _ in answers):
        return error(503, "a front of this server did not answer the list")
    items = sorted((item for answer, _ in answers if answer is not None for item in answer["items"]),
                   key=lambda item: item["createdAt"])
    offset, count = int(start), int(limit)
    next_cursor = str(offset + count) if offset + count < len(items) else None
    return web.json_response({"items": items[offset:offset + count], "nextCursor": next_cursor})


async def _name_taken(request: web.Request, peers: list[int], client: aiohttp.ClientSession
                      ) -> Optional[web.Response]:
    """409 when another front already holds a sandbox of this key by the name a creation asks for."""
    try:
        name = json.loads(await request.read()).get("name")
    except (ValueError, AttributeError):
        return None  # the handler names the problem
    if not isinstance(name, str) or not name:
        return None
    answers = await asyncio.gather(*(peer_json(client, port, request, f"{API}/sandbox/{name}") for port in peers))
    if any(answer is not None for answer, _ in answers):
        return error(409, f"Sandbox with name {name} already exists")
    return None
