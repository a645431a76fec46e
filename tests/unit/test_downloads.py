"""A download held against the server's budget until sent, and let go when its client stops reading
(verl_sf/e2b/downloads.py), on a real aiohttp server over 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from verl_sf import sending
from verl_sf.byte_budget import ByteBudget
from verl_sf.e2b import downloads
from verl_sf.e2b.downloads import DownloadsFull

BODY = b"x" * (48 << 20)  # far more than the sockets on both sides buffer


def test_the_budget_refuses_past_its_limit_but_always_takes_one() -> None:
    budget = ByteBudget(100, lambda held: DownloadsFull(f"{held} held; retry shortly"))
    with budget.hold(150):  # one download alone always fits
        refused = budget.hold(1)
        with pytest.raises(DownloadsFull, match="150 held; retry shortly"):
            refused.__enter__()
    with budget.hold(60), budget.hold(40):
        assert budget.held == 100
    assert budget.held == 0


async def test_a_client_that_stops_reading_loses_its_connection_and_its_bytes_are_let_go(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sending, "STALL_S", 2.0)
    monkeypatch.setattr(downloads, "BUDGET", ByteBudget(64 << 20, lambda held: DownloadsFull("full")))

    async def handler(request: web.Request) -> web.StreamResponse:
        return await downloads.send(request, BODY, {"Content-Type": "application/octet-stream"})

    app = web.Application()
    app.router.add_get("/file", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        assert downloads.BUDGET.held == len(BODY), "held while it is being sent"
        closed_at = asyncio.get_running_loop().time()
        while downloads.BUDGET.held and asyncio.get_running_loop().time() - closed_at < 10:
            await asyncio.sleep(0.1)
        assert downloads.BUDGET.held == 0, "let go once the client took nothing for STALL_S"
        received = 0
        while chunk := await reader.read(1 << 20):  # the server closed the connection
            received += len(chunk)
        assert received < len(BODY)
        writer.close()
    finally:
        await runner.cleanup()
