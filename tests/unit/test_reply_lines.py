"""A zygote's reply lines, read a piece at a time, are what `readline` gives, and a long one lets the
event loop turn between its pieces."""

from __future__ import annotations

import asyncio
import random

import pytest

from verl_sf.executor.reply_lines import LineTooLong, ReplyLines
from verl_sf.off_loop import PIECE_CHARS


class _CountingStream(asyncio.StreamReader):
    """A stream fed whole up front, that counts the bytes read from it in each turn of the loop."""

    def __init__(self, data: bytes):
        super().__init__(limit=len(data) + 1)
        self.feed_data(data)
        self.feed_eof()
        self.turn = 0
        self.read_in_turn: dict[int, int] = {}

    async def read(self, n: int = -1) -> bytes:
        data = await super().read(n)
        self.read_in_turn[self.turn] = self.read_in_turn.get(self.turn, 0) + len(data)
        return data


async def _all_lines(data: bytes, limit: int) -> tuple[list[bytes], _CountingStream]:
    stream = _CountingStream(data)
    reading = True

    async def count_turns() -> None:
        while reading:
            stream.turn += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    lines, reader = [], ReplyLines(stream, limit)
    try:
        while line := await reader.next():
            lines.append(line)
    finally:
        reading = False
        await counter
    return lines, stream


def test_lines_are_what_readline_gives_and_a_long_one_is_read_a_piece_per_turn() -> None:
    rng = random.Random(5)
    sizes = [0, 0, 1, 5, PIECE_CHARS - 1, PIECE_CHARS, PIECE_CHARS + 1, 3 * PIECE_CHARS + 7, *rng.choices(range(300), k=2000)]
    rng.shuffle(sizes)
    lines = [rng.randbytes(size).replace(b"\n", b"n") + b"\n" for size in sizes]
    data = b"".join(lines) + b"no newline at the end"
    read, stream = asyncio.run(_all_lines(data, 1 << 30))
    assert read == [*lines, b"no newline at the end"]
    assert max(stream.read_in_turn.values()) <= 2 * PIECE_CHARS


def test_a_line_past_the_limit_is_an_error_not_a_buffer_without_end() -> None:
    with pytest.raises(LineTooLong, match="past 1048576 bytes"):
        asyncio.run(_all_lines(b"x" * (3 * PIECE_CHARS) + b"\n", PIECE_CHARS))
