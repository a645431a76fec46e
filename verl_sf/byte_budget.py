"""Bytes a server process holds for its clients at once, against a cap: request bodies read and not
yet answered, files read from sandboxes and not yet sent.  Past the cap a client is told to come
back shortly (503 with Retry-After), rather than the server's memory be what runs out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from aiohttp import web

from verl_sf.errors import CapacityError


class ByteBudget:
    def __init__(self, limit: int, full: Callable[[int], CapacityError]):
        self.limit = limit
        self.full = full  # the error to raise, given the bytes held
        self.held = 0

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """Hold `size` more bytes until the block ends; `full(held)` past the limit (one holder alone
        always fits: its own cap bounds it)."""
        if self.held and self.held + size > self.limit:
            raise self.full(self.held)
        self.held += size
        try:
            yield
        finally:
            self.held -= size


class BodiesFull(CapacityError):
    """The server holds its budget of request bodies (read, their answers not yet sent): come back shortly."""


def body_budget(limit: int) -> ByteBudget:
    return ByteBudget(limit, lambda held: BodiesFull(f"the server holds {held >> 20} MiB of request bodies being "
                                                     "answered; retry shortly"))


BODIES_KEY = web.AppKey("bodies", ByteBudget)
"""The app's budget of request bodies (a websocket's messages count as bodies)."""
