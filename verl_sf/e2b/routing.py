"""The E2B API over several servers that share its sandboxes' ids: the fronts of one server
(`--fronts N`) or the servers of a `verl-sf cluster` fleet.

A sandbox lives in the executor that created it, and its id says which (`f{i}-i...` for a front,
`n{node}-...` for a fleet's server).  Its data plane (the `E2b-Sandbox-Id` header) and its
control-plane calls (`/sandboxes/{id}/...`) are relayed to that peer when they land elsewhere,
streams as streams; the list merges every peer's sandboxes; a new sandbox goes where the peers'
placement says.  A sandbox whose peer is gone is not found, as E2B words it.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from verl_sf.e2b.config import JUPYTER_PORT
from verl_sf.e2b.control import ListQuery, error, paged_list, validated
from verl_sf.server.relay import Handler, Peers, PeerUnreachable, peer_lists, place, relay, unrelayable

CONTROL_PATHS = ("/sandboxes", "/v2/sandboxes")


def is_e2b(request: web.Request) -> bool:
    return "E2b-Sandbox-Id" in request.headers or request.path.startswith(CONTROL_PATHS)


async def route_e2b(request: web.Request, handler: Handler, peers: Peers,
                    client: aiohttp.ClientSession) -> web.StreamResponse:
    header = unrelayable(request)
    if header is not None:
        return error(400, f"header {header}: not ASCII")
    ident = request.headers.get("E2b-Sandbox-Id")
    if ident is None:
        parts = request.path.split("/")[2 if request.path.startswith("/sandboxes") else 3:]  # id, action...
        if not parts or not parts[0]:
            if request.method == "GET":
                return await _list_all(request, peers, client)
            return await place(request, handler, peers, client,
                               error(503, "no server of the fleet could take a new sandbox"))
        ident = parts[0]
    owner = peers.owner(ident)
    if owner is None or owner == peers.own:
        return await handler(request)
    try:
        return await relay(request, peers, owner, client)
    except PeerUnreachable:
        return gone(request, ident)


def gone(request: web.Request, ident: str) -> web.Response:
    """What E2B answers for a sandbox no live server holds (the same to every caller: no owner is known)."""
    message = f"The sandbox {ident} was not found: the server that held it is gone"
    if "E2b-Sandbox-Id" not in request.headers:
        return error(404, message)
    if request.headers.get("E2b-Sandbox-Port") == JUPYTER_PORT:
        return web.Response(status=404, text=message)
    return error(502, message)  # E2B's proxy: the SDK's "sandbox not running" error


async def _list_all(request: web.Request, peers: Peers, client: aiohttp.ClientSession) -> web.Response:
    """GET /sandboxes over every peer: each one's whole list, merged and paged here as one server pages."""
    query = validated(ListQuery, dict(request.query))
    if isinstance(query, web.Response):
        return query
    params = {k: v for k, v in request.query.items() if k not in ("limit", "nextToken")}
    lists = await peer_lists(client, peers, request, request.path, params)
    if lists is None:
        return error(503, "a server holding sandboxes did not answer the list")
    if isinstance(lists, web.Response):
        return lists
    return paged_list([s for listed in lists for s in listed], query.next_token, query.limit)
