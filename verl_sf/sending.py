"""Sending a large answer (a run's fetched files and outputs, a downloaded file) a piece at a time.

aiohttp joins the headers and a whole body into one bytes before writing them (on Python before
3.12.9), a copy of tens of MB on the event loop while every other client waits; and a client that
never reads would pin the bytes for good.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

STALL_S = 30.0  # a client that takes nothing of its answer for this long has given up
PIECE_BYTES = 256 << 10  # a large answer is written this much at a time


async def answer_in_pieces(request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """`body` sent PIECE_BYTES at a time; a client that takes nothing for STALL_S loses its
    connection, and with it the bytes held for it."""
    response = web.StreamResponse(headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    try:
        for start in range(0, len(body), PIECE_BYTES):
            await asyncio.wait_for(response.write(view[start:start + PIECE_BYTES]), STALL_S)
        await response.write_eof()
    except asyncio.TimeoutError:
        if request.transport is not None:
            request.transport.abort()
    return response
