"""Counting the event loop's turns, and the bytes a stream gives in each: work on a large document
done a piece at a time must let the loop turn between its pieces (a structural check, not a timing)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Turns:
    """The turns the loop has taken while counted, and the bytes read in each (`record`)."""

    def __init__(self) -> None:
        self.count = 0
        self.read: dict[int, int] = {}
        self.counting = True

    def record(self, size: int) -> None:
        self.read[self.count] = self.read.get(self.count, 0) + size


class CountedReads:
    """Mixed into a stream class (asyncio's or aiohttp's StreamReader): fed whole up front (`fill`),
    it records the bytes each `read` gives in the turn it is made."""

    turns: Turns

    def fill(self, data: bytes, turns: Turns) -> None:
        self.feed_data(data)  # type: ignore[attr-defined]
        self.feed_eof()  # type: ignore[attr-defined]
        self.turns = turns

    async def read(self, n: int = -1) -> bytes:
        data: bytes = await super().read(n)  # type: ignore[misc]
        self.turns.record(len(data))
        return data


@contextlib.asynccontextmanager
async def counted_turns() -> AsyncIterator[Turns]:
    turns = Turns()

    async def count() -> None:
        while turns.counting:
            turns.count += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    await asyncio.sleep(0)
    try:
        yield turns
    finally:
        turns.counting = False
        await counter
