"""What client connections may cost a server process: open files, and only so many of them.

Every connection holds a file descriptor, and a process has RLIMIT_NOFILE of them; past it the
server can accept nothing, not even /v1/ping.  So at start the soft limit goes up as far as the
hard limit allows, and connections are capped below it, leaving room for the sandboxes' pipes.
At the cap the connection that has waited longest for its request (an idle keep-alive one, or a
header or body still coming) is closed to let the new one in, as nginx reuses idle keep-alive
connections: slow clients cannot crowd out fast ones.  Only when every connection is inside a
handler is the newcomer answered 503 with Retry-After.

A connection has `header_timeout_s` to deliver its first request's header (aiohttp's keep-alive
time-out covers the later ones, counted from each reply, but not the first before aiohttp 3.14);
its bodies are the body middleware's business (`verl_sf.server.requests`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import resource
from typing import Optional, cast

from aiohttp import web

log = logging.getLogger(__name__)
REFUSED_LINGER_S = 2.0


def raise_open_files_limit() -> int:
    """RLIMIT_NOFILE's soft limit raised to the hard limit; the soft limit in effect is returned."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard != resource.RLIM_INFINITY:  # Linux caps both at fs.nr_open: infinity is never set
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("verl-sf: cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
    return soft


def connection_cap(requested: Optional[int], open_files: int) -> int:
    """`requested` (None: as many as fit), kept below `open_files` by a reserve for everything else
    the process opens (a quarter, at least 256 or half of a tiny limit)."""
    ceiling = open_files - max(min(256, open_files // 2), open_files // 4)
    if requested is None:
        return ceiling
    if requested > ceiling:
        log.warning("verl-sf: --max-connections %d lowered to %d: this process may open %d files", requested,
                    ceiling, open_files)
        return ceiling
    return requested


class ConnectionLimit:
    """The open connections of one server process (every site of it), at most `maximum`."""

    def __init__(self, maximum: int, retry_after_s: int, header_timeout_s: float):
        if maximum < 1:
            raise ValueError(f"the connection limit must be at least 1, got {maximum}")
        self.maximum = maximum
        self.retry_after_s = retry_after_s
        self.header_timeout_s = header_timeout_s
        self.evicted = 0
        """Connections closed at the cap to let a new one in."""
        self.refused = 0
        """New connections answered 503 because every open one was busy."""
        self._waiting: collections.OrderedDict[TrackedConnection, None] = collections.OrderedDict()
        """Connections waiting for a request or its body, the longest-waiting first."""
        self._working: set[TrackedConnection] = set()

    @property
    def open(self) -> int:
        return len(self._waiting) + len(self._working)

    def admit(self, connection: TrackedConnection) -> bool:
        if self.open >= self.maximum:
            if not self._waiting:
                self.refused += 1
                return False
            oldest, _ = self._waiting.popitem(last=False)
            oldest.evict()
            self.evicted += 1
        self._waiting[connection] = None
        return True

    def waiting(self, connection: TrackedConnection) -> None:
        self._working.discard(connection)
        self._waiting[connection] = None
        self._waiting.move_to_end(connection)

    def working(self, connection: TrackedConnection) -> None:
        self._waiting.pop(connection, None)
        self._working.add(connection)

    def forget(self, connection: TrackedConnection) -> None:
        self._waiting.pop(connection, None)
        self._working.discard(connection)


class TrackedConnection(asyncio.Protocol):
    """One client connection: aiohttp's request handler speaks HTTP on it, this counts it in a
    `ConnectionLimit` (the transport's protocol, so a request finds it: `TrackedConnection.of`)."""

    def __init__(self, limit: ConnectionLimit, server: web.Server):
        self._limit = limit
        self._server = server
        self._handler: Optional[web.RequestHandler] = None
        self._transport: Optional[asyncio.Transport] = None
        self._header_deadline: Optional[asyncio.TimerHandle] = None
        self._closed = False

    @classmethod
    def of(cls, request: web.BaseRequest) -> Optional[TrackedConnection]:
        protocol = request.transport.get_protocol() if request.transport is not None else None
        return protocol if isinstance(protocol, cls) else None

    def request_started(self) -> None:
        """A request's header is in: it waits for its body now."""
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        self.waiting()

    def waiting(self) -> None:
        """Between requests, or reading one's body: the connection may be evicted."""
        if not self._closed:
            self._limit.waiting(self)

    def working(self) -> None:
        """A handler is running for it: it is never evicted."""
        if not self._closed:
            self._limit.working(self)

    def evict(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a TCP transport (uvloop's are not asyncio's subclasses)
        self._transport = transport
        if self._limit.admit(self):
            self._header_deadline = asyncio.get_running_loop().call_later(self._limit.header_timeout_s, self.evict)
            self._handler = self._server()
            self._handler.connection_made(transport)
            return
        detail = json.dumps({"detail": f"server overloaded: all {self._limit.maximum} connections are busy"})
        transport.write(f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        f"Retry-After: {self._limit.retry_after_s}\r\nConnection: close\r\n"
                        f"Content-Length: {len(detail)}\r\n\r\n{detail}".encode())
        # Half-closed, so the answer is read even if the request arrives meanwhile (closing on unread
        # data would reset it); the client's own close ends it, or this deadline.
        transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.abort)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._closed = True
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._limit.forget(self)
        if self._handler is not None:
            self._handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._handler is not None:
            self._handler.data_received(data)

    def eof_received(self) -> None:  # None, as aiohttp's handler answers: the transport closes
        if self._handler is not None:
            self._handler.eof_received()

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()


class LimitedSite(web.BaseSite):
    """aiohttp's TCPSite with every connection counted in `limit`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limit: ConnectionLimit, *,
                 backlog: int = 128, reuse_port: bool = False):
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._limit, self._reuse_port = host, port, limit, reuse_port
        self._listener: Optional[asyncio.Server] = None

    @property
    def port(self) -> int:
        """The bound port (the kernel's pick for port 0) once started."""
        assert self._listener is not None, "the site has not started"
        port: int = self._listener.sockets[0].getsockname()[1]
        return port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port if self._listener else self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "the runner is not set up"
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: TrackedConnection(self._limit, server), self._host, self._port, backlog=self._backlog,
            reuse_port=self._reuse_port or None)
        self._server = self._listener
