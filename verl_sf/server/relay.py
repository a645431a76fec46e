"""Passing a request on to the peer that holds what it names: another front of the same server over
loopback (`--fronts N`), or another server of a `verl-sf cluster` fleet.

The request goes as it came (method, path and query, headers but the hop-by-hop ones, body), and
the answer comes back as it is produced: a stream stays a stream (E2B's commands, Connect
streams), a websocket is relayed frame by frame both ways with the owner's close code and reason.
A peer that cannot be reached before it answers raises `PeerUnreachable`, so the caller can say
what is gone instead of hanging or failing mid-answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import aiohttp
import yarl
from aiohttp import WSMsgType, web
from multidict import CIMultiDict

from verl_sf.errors import VerlSfError

FRONT_ID = re.compile(r"^(?:n[0-9a-f]+-[0-9a-f]+-)?f(\d+)-")  # a front's id (after its fleet server's part)
FULL = (429, 503)  # a peer's answer to a creation when it has no room: the placement's next peer is tried
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CONNECT_TIMEOUT_S = 5.0  # a peer that does not take the connection by then is as good as gone


class PeerUnreachable(VerlSfError):
    """The peer holding what a request names did not take the request (refused, reset, timed out)."""


def front_of(ident: str, fronts: int) -> Optional[int]:
    """The front an id names; None for an id no front of this server gave out."""
    match = FRONT_ID.match(ident)
    return int(match.group(1)) if match is not None and int(match.group(1)) < fronts else None


@dataclass(frozen=True)
class Peers:
    """The servers that share one space of sandbox ids: one server's fronts, or a fleet's servers."""

    urls: Sequence[str]
    """Each peer's base URL; an id's owner is an index into it."""
    own: int
    """This server's index."""
    owner: Callable[[str], Optional[int]]
    """The peer an id names; None for an id no peer gave out (this server answers it)."""
    placement: Callable[[], Sequence[int]]
    """The peers to try, in order, for a new sandbox: the next when one is full (503) or unreachable."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every request to a peer (the fleet's mark that a request has been routed)."""


HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Content-Length", "Sec-WebSocket-Key", "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol", "Sec-WebSocket-Accept"))


def unrelayable(request: web.Request) -> Optional[str]:
    """The first header whose value is not ASCII, which a relay cannot pass on as it came (bytes that are not
    UTF-8 reach the server as lone surrogates): such a request is refused before any peer sees it."""
    return next((name for name, value in request.headers.items() if not value.isascii()), None)


def _kept(headers: Any) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in HOP_BY_HOP}


def _headers(request: web.Request, peers: Peers) -> CIMultiDict[str]:
    """A request's headers for a peer, every one in the order it came (a header sent twice reaches the peer
    twice, so the peer reads the same key the caller's server would); its body goes as the server read it,
    inflated (aiohttp undoes a Content-Encoding); the peer's mark is added."""
    kept = CIMultiDict((name, value) for name, value in request.headers.items()
                       if name.lower() not in HOP_BY_HOP and name.lower() != "content-encoding")
    kept.extend(peers.headers)
    return kept


def _url(peers: Peers, peer: int, request: web.Request) -> yarl.URL:
    """The peer's URL for the request's path and query exactly as they came: not normalised (a `..` in it
    must not make the peer answer another route than the one this server routed by) nor re-quoted."""
    return yarl.URL(peers.urls[peer] + request.raw_path, encoded=True)


@contextlib.contextmanager
def _reaching(peers: Peers, peer: int) -> Iterator[None]:
    """A connection to `peer` that fails before the peer answers becomes PeerUnreachable."""
    try:
        yield
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
        raise PeerUnreachable(f"{peers.urls[peer]}: {type(exc).__name__}: {exc}") from exc


def peer_client() -> aiohttp.ClientSession:
    """The session peers are called with: no deadline on an answer (a run takes its time), a short one on
    connecting (a peer that does not take the connection by then is as good as gone)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                                 connector=aiohttp.TCPConnector(limit=0))


async def peer_json(client: aiohttp.ClientSession, peers: Peers, peer: int, request: web.Request, path: str,
                    params: Optional[dict[str, str]] = None) -> tuple[int, Optional[Any]]:
    """A peer's answer to GET `path` with the caller's headers: its status (0: no answer) and JSON body."""
    try:
        async with client.get(yarl.URL(peers.urls[peer] + path, encoded=True), headers=_headers(request, peers),
                              params=params, timeout=aiohttp.ClientTimeout(total=30, sock_connect=CONNECT_TIMEOUT_S)
                              ) as answer:
            try:
                return answer.status, await answer.json(content_type=None)
            except ValueError:
                return answer.status, None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return 0, None


async def peer_lists(client: aiohttp.ClientSession, peers: Peers, request: web.Request, path: str,
                     params: dict[str, str]) -> Union[list[Any], web.Response, None]:
    """Every peer's JSON answer to GET `path`; a peer's 4xx as it came (the request's fault: no key, a bad
    query); None when a peer did not answer (its list cannot be left out unsaid)."""
    answers = await asyncio.gather(*(peer_json(client, peers, peer, request, path, params)
                                     for peer in range(len(peers.urls))))
    for status, body in answers:
        if 400 <= status < 500:
            return web.json_response(body, status=status)
    if any(status != 200 for status, _ in answers):
        return None
    return [body for _, body in answers]


async def forward(request: web.Request, peers: Peers, peer: int, client: aiohttp.ClientSession) -> web.Response:
    """The request to `peer`, its whole answer read back (for answers that may be tried elsewhere)."""
    with _reaching(peers, peer):
        async with client.request(request.method, _url(peers, peer, request),
                                   data=await request.read() or None, headers=_headers(request, peers),
                                   auto_decompress=False) as answer:
            return web.Response(status=answer.status, body=await answer.read(), headers=_kept(answer.headers))


async def place(request: web.Request, handler: Handler, peers: Peers, client: aiohttp.ClientSession,
                refused: web.StreamResponse) -> web.StreamResponse:
    """A creation, on the first peer of the placement that takes it: the next is tried when one is full
    (503, 429) or unreachable; `refused` when there is no peer to try."""
    answer = refused
    for peer in peers.placement():
        try:
            answer = await (handler(request) if peer == peers.own else forward(request, peers, peer, client))
        except PeerUnreachable:
            continue
        if answer.status not in FULL:
            return answer
    return answer


async def relay(request: web.Request, peers: Peers, peer: int, client: aiohttp.ClientSession) -> web.StreamResponse:
    """The request to `peer`; its answer streamed back."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        try:
            return await _relay_websocket(request, peers, peer, client)
        except aiohttp.WSServerHandshakeError:
            pass  # the peer answered, not with a websocket (not a websocket route): its answer as HTTP
    body = await request.read()
    with _reaching(peers, peer):
        answer = await client.request(request.method, _url(peers, peer, request), data=body or None,
                                      headers=_headers(request, peers), auto_decompress=False)
    async with answer:
        response = web.StreamResponse(status=answer.status, headers=_kept(answer.headers))
        await response.prepare(request)
        async for chunk in answer.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _relay_websocket(request: web.Request, peers: Peers, peer: int,
                           client: aiohttp.ClientSession) -> web.WebSocketResponse:
    with _reaching(peers, peer):  # a handshake the peer refused is no ClientConnectionError: it goes up as it is
        # The peer is one of ours: its frames (a run's output) have no size cap; a client's are a request's.
        theirs = await client.ws_connect(_url(peers, peer, request), headers=_headers(request, peers), max_msg_size=0)
    ours = web.WebSocketResponse(max_msg_size=request.app["max_body_bytes"], compress=False)  # as the peer's
    await ours.prepare(request)
    async with theirs:
        upstream = asyncio.ensure_future(_pump(ours, theirs))
        try:
            code, reason = 1000, b""
            while True:
                message = await theirs.receive()
                if message.type == WSMsgType.TEXT:
                    await ours.send_str(message.data)
                elif message.type == WSMsgType.BINARY:
                    await ours.send_bytes(message.data)
                else:
                    if message.type == WSMsgType.CLOSE:
                        code, reason = message.data, (message.extra or "").encode()
                    break
            await ours.close(code=code, message=reason)
        finally:  # our client left (or this handler was cancelled): the owner sees its client leave
            upstream.cancel()
    return ours


async def _pump(ours: web.WebSocketResponse, theirs: aiohttp.ClientWebSocketResponse[bool]) -> None:
    async for message in ours:
        if message.type == WSMsgType.TEXT:
            await theirs.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await theirs.send_bytes(message.data)
    await theirs.close()
