"""Passing a request on to another front of the same server, over loopback (`--fronts N`).

The request goes as it came (method, path and query, headers but the hop-by-hop ones, body), and
the answer comes back as it is produced: a stream stays a stream (E2B's commands, Connect
streams), a websocket is relayed frame by frame both ways with the owner's close code and reason.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Optional

import aiohttp
from aiohttp import WSMsgType, web

FRONT_ID = re.compile(r"^f(\d+)-")  # an id a front gave out (server.fronts.front_session_id)


def front_of(ident: str, fronts: int) -> Optional[int]:
    """The front an id names; None for an id no front of this server gave out."""
    match = FRONT_ID.match(ident)
    return int(match.group(1)) if match is not None and int(match.group(1)) < fronts else None


HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Content-Length", "Sec-WebSocket-Key", "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol", "Sec-WebSocket-Accept"))


def _headers(headers: Any) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in HOP_BY_HOP}


async def peer_json(client: aiohttp.ClientSession, port: int, request: web.Request, path: str,
                    params: Optional[dict[str, str]] = None) -> tuple[Optional[Any], dict[str, str]]:
    """A front's JSON answer to GET `path` with the caller's headers, and its headers; (None, {}) unless a 200."""
    try:
        async with client.get(f"http://127.0.0.1:{port}{path}", headers=_headers(request.headers), params=params,
                              timeout=aiohttp.ClientTimeout(total=30)) as answer:
            if answer.status != 200:
                return None, {}
            return await answer.json(), dict(answer.headers)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None, {}


async def relay(request: web.Request, port: int, client: aiohttp.ClientSession) -> web.StreamResponse:
    """The request to the front on `port`; its answer streamed back."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _relay_websocket(request, port, client)
    body = await request.read()
    async with client.request(request.method, f"http://127.0.0.1:{port}{request.path_qs}", data=body or None,
                              headers=_headers(request.headers), auto_decompress=False) as answer:
        response = web.StreamResponse(status=answer.status, headers=_headers(answer.headers))
        await response.prepare(request)
        async for chunk in answer.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _relay_websocket(request: web.Request, port: int, client: aiohttp.ClientSession) -> web.WebSocketResponse:
    ours = web.WebSocketResponse()
    await ours.prepare(request)
    async with client.ws_connect(f"http://127.0.0.1:{port}{request.path_qs}",
                                 headers=_headers(request.headers)) as theirs:
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
