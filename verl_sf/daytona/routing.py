"""The Daytona API over several servers that share its sandboxes' ids: the fronts of one server
(`--fronts N`) or the servers of a `verl-sf cluster` fleet.

A sandbox lives in the executor that created it, and its id says which (`f{i}-...` for a front,
`n{node}-...` for a fleet's server).  A call on an id another peer holds is relayed there (HTTP as
it came, the interpreter's websocket frame by frame, the `Host` kept so answers name the URL the
client called); a call on a sandbox's name asks every peer which holds it.  The list merges every
peer's sandboxes, a new name is checked against every peer first, and a new sandbox goes where
the peers' placement says.  A sandbox whose peer is gone is not found, as Daytona words it.
"""

from __future__ import annotations

import asyncio
from typing import Optional
from urllib.parse import quote

import aiohttp
from aiohttp import web

from verl_sf.daytona.control import API, TOOLBOX, list_limit, paged_list
from verl_sf.daytona.sandboxes import NotFound
from verl_sf.daytona.wire import error
from verl_sf.json_body import load_json_off_loop
from verl_sf.server.relay import Handler, Peers, PeerUnreachable, peer_json, peer_lists, place, relay, unrelayable

DAYTONA_PATHS = (f"{API}/sandbox", TOOLBOX)
ALL = "999999999"  # the page size that asks a peer for its whole list


async def route_daytona(request: web.Request, handler: Handler, peers: Peers,
                        client: aiohttp.ClientSession) -> web.StreamResponse:
    header = unrelayable(request)
    if header is not None:
        return error(400, f"header {header}: not ASCII")
    parts = request.path.split("/")  # ["", "api", "sandbox" | "toolbox", id-or-name, ...]
    if len(parts) < 4 or not parts[3]:
        if request.method == "GET" and request.path == f"{API}/sandbox":
            return await _list_all(request, peers, client)
        if request.method == "POST" and request.path == f"{API}/sandbox":
            taken = await _name_taken(request, peers, client)
            if taken is not None:
                return taken
            return await place(request, handler, peers, client,
                               error(503, "no server of the fleet could take a new sandbox"))
        return await handler(request)
    owner = await _owner(request, parts[3], peers, client)
    if owner is None or owner == peers.own:
        return await handler(request)
    try:
        return await relay(request, peers, owner, client)
    except PeerUnreachable:  # the same answer to every caller: the owner's key cannot be checked
        return error(404, str(NotFound(parts[3])))


async def _owner(request: web.Request, ident: str, peers: Peers, client: aiohttp.ClientSession) -> Optional[int]:
    """The peer holding the sandbox `ident` (an id, or a name any peer may hold); None: let this one answer."""
    owner = peers.owner(ident)
    if owner is not None:
        return owner
    answers = await asyncio.gather(*(peer_json(client, peers, peer, request, f"{API}/sandbox/{quote(ident, safe='')}")
                                     for peer in range(len(peers.urls))))
    found = [peer for peer, (status, _) in enumerate(answers) if status == 200]
    return found[0] if found else None


async def _list_all(request: web.Request, peers: Peers, client: aiohttp.ClientSession) -> web.Response:
    """GET /api/sandbox over every peer: each one's whole list, merged and paged here as one server pages."""
    limit = list_limit(request)
    if limit is None:
        return error(400, "limit: must be a positive integer")
    params = {k: v for k, v in request.query.items() if k not in ("cursor", "limit")}
    lists = await peer_lists(client, peers, request, f"{API}/sandbox", {**params, "limit": ALL})
    if lists is None:
        return error(503, "a server holding sandboxes did not answer the list")
    if isinstance(lists, web.Response):
        return lists
    return paged_list([item for listed in lists for item in listed["items"]], request.query.get("cursor"), limit)


async def _name_taken(request: web.Request, peers: Peers, client: aiohttp.ClientSession) -> Optional[web.Response]:
    """409 when a peer already holds a sandbox of this key by the name a creation asks for."""
    try:
        name = (await load_json_off_loop(await request.read())).get("name")
    except (ValueError, AttributeError):
        return None  # the handler names the problem
    if not isinstance(name, str) or not name:
        return None
    answers = await asyncio.gather(*(peer_json(client, peers, peer, request, f"{API}/sandbox/{quote(name, safe='')}")
                                     for peer in range(len(peers.urls))))
    if any(status == 200 for status, _ in answers):
        return error(409, f"Sandbox with name {name} already exists")
    return None
