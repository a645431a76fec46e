"""E2B and Daytona sandboxes across a `verl-sf cluster` fleet: any server's URL reaches them all.

A fleet server is started with its node's tag and the path of the fleet's directory, a JSON file
`{"servers": {tag: url}}` its node actor keeps current (verl_sf/cluster).  Its sandbox ids begin
with `n{tag}-{boot}-`, `boot` new each time the server starts; a call on an id of another node's
server is relayed there, the list merges every server's, and new sandboxes go round the fleet (the
next server when one is full or down).  A sandbox whose server is gone (unreachable, restarted: an
older boot, or its node left the fleet) is not found, as E2B or Daytona word it, for every caller.
A request relayed once carries `FLEET_HOP` and is answered where it lands, so nothing loops.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import secrets
from pathlib import Path
from typing import Optional

from aiohttp import web

from verl_sf.daytona.routing import DAYTONA_PATHS, route_daytona
from verl_sf.e2b.routing import gone, is_e2b, route_e2b
from verl_sf.server.relay import Handler, Peers, peer_client

FLEET_HOP = "X-Verl-Sf-Fleet-Hop"
NODE_TAG = re.compile(r"^[0-9a-f]{1,56}$")
NODE_ID = re.compile(r"^n([0-9a-f]+)-([0-9a-f]+)-")  # the server an id names: its node's tag, its boot


@dataclasses.dataclass(frozen=True)
class FleetMember:
    """What makes a server one of a fleet's: its node's tag and where the fleet's directory is."""

    node: str
    directory: Path
    boot: str = dataclasses.field(default_factory=lambda: secrets.token_hex(2))
    """Tells this server's sandboxes from those of the node's server before a restart."""

    def __post_init__(self) -> None:
        if NODE_TAG.match(self.node) is None:
            raise ValueError(f"a fleet node's tag is lowercase hex, got {self.node!r}")

    @property
    def id_prefix(self) -> str:
        return f"n{self.node}-{self.boot}-"


def node_tag(node_id: str) -> str:
    """The tag a Ray node's server puts in its sandbox ids (as `verl-sf cluster status` shows nodes)."""
    return node_id[:12]


class FleetRouting:
    """The middleware that sends each E2B and Daytona call to the fleet server holding its sandbox."""

    def __init__(self, member: FleetMember):
        self.member = member
        self._seen: Optional[tuple[int, int]] = None
        self._peers: Optional[Peers] = None
        self._turn = itertools.count()

    def install(self, app: web.Application) -> None:
        app.middlewares.insert(1, self.middleware)  # after the body's, before the fronts' and the E2B data plane's
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        self._client = peer_client()

    async def _stop(self, app: web.Application) -> None:
        await self._client.close()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        ident = request.headers.get("E2b-Sandbox-Id")
        if ident is not None and self.gone(ident):  # else a data-plane call on an unknown id is told 401
            return gone(request, ident)
        if FLEET_HOP in request.headers:
            return await handler(request)
        route = route_daytona if request.path.startswith(DAYTONA_PATHS) else route_e2b if is_e2b(request) else None
        peers = self.peers() if route is not None else None
        if route is None or peers is None:
            return await handler(request)
        return await route(request, handler, peers, self._client)

    def gone(self, ident: str) -> bool:
        """Whether `ident` names a sandbox of a fleet server that no longer runs."""
        match = NODE_ID.match(ident)
        if match is None:
            return False
        if match.group(1) == self.member.node:
            return match.group(2) != self.member.boot
        peers = self.peers()
        return peers is not None and peers.owner(ident) is None

    def peers(self) -> Optional[Peers]:
        """The fleet as the directory lists it now; None until it lists this server (it answers alone)."""
        try:
            stat = os.stat(self.member.directory)
        except OSError:
            return None
        if self._seen != (stat.st_mtime_ns, stat.st_size):
            self._seen, self._peers = (stat.st_mtime_ns, stat.st_size), self._read()
        return self._peers

    def _read(self) -> Optional[Peers]:
        try:
            servers = json.loads(self.member.directory.read_text())["servers"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        tags = sorted(servers)
        if self.member.node not in tags:
            return None
        index = {tag: i for i, tag in enumerate(tags)}

        def owner(ident: str) -> Optional[int]:
            match = NODE_ID.match(ident)
            return index.get(match.group(1)) if match is not None else None

        def placement() -> list[int]:
            first = next(self._turn) % len(tags)
            return [(first + i) % len(tags) for i in range(len(tags))]

        return Peers(urls=[servers[tag] for tag in tags], own=index[self.member.node], owner=owner,
                     placement=placement, headers={FLEET_HOP: self.member.node})
