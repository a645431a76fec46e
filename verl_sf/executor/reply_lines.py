"""A zygote's replies, one JSON line each, read a piece at a time.

asyncio's `readline` keeps a long line whole in the stream's buffer and copies it out twice in one
turn of the event loop (~40 ms for a 43 MB reply, every other client waiting).  Here the stream is
drained a MiB at a time, with a turn of the loop between pieces of a line, and a long line is
joined in a thread (`bytes.join` lets the GIL go past a MiB).
"""

from __future__ import annotations

import asyncio

from verl_sf.errors import SandboxFailure
from verl_sf.off_loop import PIECE_CHARS, off_loop


class LineTooLong(SandboxFailure):
    """A reply line past the reader's limit: the zygote broke its own caps."""


class ReplyLines:
    def __init__(self, stream: asyncio.StreamReader, limit: int):
        self.stream = stream
        self.limit = limit
        self.piece = b""  # read from the stream, not yet all taken
        self.taken = 0  # how much of `piece` earlier lines took

    async def next(self) -> bytes:
        """The next line with its newline; at the stream's end what is left without one, then b""."""
        parts: list[bytes] = []
        size = 0
        while True:
            cut = self.piece.find(b"\n", self.taken)
            end = len(self.piece) if cut < 0 else cut + 1
            if end > self.taken:
                parts.append(self.piece[self.taken:end])
                size += end - self.taken
                self.taken = end
            if cut >= 0:
                break
            if size > self.limit:
                raise LineTooLong(f"a reply line past {self.limit} bytes")
            if parts:
                await asyncio.sleep(0)  # the stream may hold the rest already: `read` would not yield
            self.piece, self.taken = await self.stream.read(PIECE_CHARS), 0
            if not self.piece:
                break
        return await off_loop(size, b"".join, parts)
