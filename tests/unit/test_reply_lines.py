"""A zygote's reply lines, read a piece at a time, are what `readline` gives, and a long one lets the
event loop turn between its pieces."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.loop_turns import CountedReads, Turns, counted_turns
from verl_sf.executor.reply_lines import LineTooLong, ReplyLines
from verl_sf.off_loop import PIECE_CHARS


class _CountingStream(CountedReads, asyncio.StreamReader):
    """A stream fed whole up front, that records the bytes read from it in each turn of the loop."""

    def __init__(self, data: bytes, turns: Turns):
        super().__init__(limit=len(data) + 1)
        self.fill(data, turns)


async def _all_lines(data: bytes, limit: int) -> tuple[list[bytes], Turns]:
    async with counted_turns() as turns:
        lines, reader = [], ReplyLines(_CountingStream(data, turns), limit)
        while line := await reader.next():
            lines.append(line)
    return lines, turns


def test_lines_are_what_readline_gives_and_a_long_one_is_read_a_piece_per_turn() -> None:
    rng = random.Random(5)
    sizes = [0, 0, 1, 5, PIECE_CHARS - 1, PIECE_CHARS, PIECE_CHARS + 1, 3 * PIECE_CHARS + 7, *rng.choices(range(300), k=2000)]
    rng.shuffle(sizes)
    lines = [rng.randbytes(size).replace(b"\n", b"n") + b"\n" for size in sizes]
    data = b"".join(lines) + b"no newline at the end"
    read, turns = asyncio.run(_all_lines(data, 1 << 30))
    assert read == [*lines, b"no newline at the end"]
    assert max(turns.read.values()) <= 2 * PIECE_CHARS


def test_a_line_past_the_limit_is_an_error_not_a_buffer_without_end() -> None:
    with pytest.raises(LineTooLong, match="past 1048576 bytes"):
        asyncio.run(_all_lines(b"x" * (3 * PIECE_CHARS) + b"\n", PIECE_CHARS))
