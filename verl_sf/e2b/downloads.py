"""Sending a file read from a sandbox (E2B's `files.read`, Daytona's downloads) without letting
clients that never read pin the server's memory.

A file is read whole from its sandbox (up to the executor's fetch limit, 32 MiB), so until it is
sent the server holds it.  Two bounds: the bytes all downloads of this server process hold at once
(`BUDGET_BYTES`; past it a download answers 503 with Retry-After, as an overloaded server does),
and how long a client may leave a download unread (`sending.STALL_S`; then its connection is closed and
the bytes are let go).
"""

from __future__ import annotations

from aiohttp import web

from verl_sf.byte_budget import ByteBudget
from verl_sf.errors import CapacityError
from verl_sf.sending import answer_in_pieces

BUDGET_BYTES = 256 << 20  # eight files at the fetch limit at once


class DownloadsFull(CapacityError):
    """This server already holds `BUDGET_BYTES` of downloads not yet sent: try again shortly (503)."""


BUDGET = ByteBudget(BUDGET_BYTES, lambda held: DownloadsFull(f"the server is sending {held >> 20} MiB of downloads "
                                                                   "already; retry shortly"))
"""This server process's budget (each front of `--fronts N` is a process with its own)."""


async def send(request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """`body` to the client in pieces, held against the budget until sent."""
    with BUDGET.hold(len(body)):
        return await answer_in_pieces(request, body, headers)
