"""An uploaded file part (E2B's `files.write`, Daytona's bulk upload) is read a piece at a time, with
the event loop's turns between, and comes out byte for byte what aiohttp's `part.read()` gives."""

from __future__ import annotations

import asyncio
import random

from aiohttp import BodyPartReader, MultipartReader, MultipartWriter, StreamReader
from multidict import CIMultiDict

from tests.loop_turns import CountedReads, Turns, counted_turns
from verl_sf.e2b.envd import part_bytes
from verl_sf.off_loop import PIECE_CHARS

BOUNDARY = "b0undary"


class _Protocol:
    """What a StreamReader needs of a protocol when its data is fed whole."""

    _reading_paused = False

    def pause_reading(self, **_: object) -> None:
        pass

    def resume_reading(self, **_: object) -> None:
        pass


def _contents(rng: random.Random) -> list[bytes]:
    """Parts with the boundary's near misses planted on each side of every piece's edge."""
    contents = []
    for size in (3 * PIECE_CHARS + 17, PIECE_CHARS, 5, 0):
        data = bytearray(rng.randbytes(size))
        for edge in range(PIECE_CHARS, size, PIECE_CHARS):
            for offset in (-12, -7, -3, 0, 2, 9):
                lure = b"\r\n--" + BOUNDARY.encode()[: rng.randint(1, len(BOUNDARY) - 1)]
                data[edge + offset: edge + offset + len(lure)] = lure
        contents.append(bytes(data[:size]))
    return contents


async def _body(contents: list[bytes]) -> tuple[bytes, str]:
    writer = MultipartWriter("form-data", boundary=BOUNDARY)
    for index, content in enumerate(contents):
        writer.append(content).set_content_disposition("form-data", name="file", filename=f"f{index}")

    class Sink:
        data = bytearray()

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    await writer.write(sink)  # type: ignore[arg-type]
    return bytes(sink.data), writer.headers["Content-Type"]


class _CountingStream(CountedReads, StreamReader):
    """A body fed whole up front, that records the bytes read from it in each turn of the loop."""

    def __init__(self, body: bytes, turns: Turns):
        super().__init__(_Protocol(), limit=len(body) + 1, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        self.fill(body, turns)


def _reader(body: bytes, content_type: str, turns: Turns) -> MultipartReader:
    return MultipartReader(CIMultiDict({"Content-Type": content_type}), _CountingStream(body, turns))


async def _parts(reader: MultipartReader, read: object) -> list[bytes]:
    parts = []
    while (part := await reader.next()) is not None:
        assert isinstance(part, BodyPartReader)
        parts.append(await read(part))  # type: ignore[operator]
    return parts


def test_a_part_read_in_pieces_is_what_part_read_gives_and_lets_the_loop_turn() -> None:
    async def check() -> None:
        contents = _contents(random.Random(3))
        body, content_type = await _body(contents)
        async with counted_turns() as turns:
            pieces = await _parts(_reader(body, content_type, turns), part_bytes)
        assert pieces == contents
        assert max(turns.read.values()) <= 2 * PIECE_CHARS  # a piece and the look-ahead for the boundary
        whole = await _parts(_reader(body, content_type, Turns()), BodyPartReader.read)
        assert [bytes(part) for part in whole] == contents

    asyncio.run(check())


def test_thousands_of_small_parts_are_read_about_once_each() -> None:
    """A read takes up to its size of the body and puts back what is past the part: a MiB read per
    small part would copy the body over and over (an upload of 6,000 small files held the loop 0.4 s)."""

    async def check() -> None:
        contents = [b"x" * 10 for _ in range(3000)]
        body, content_type = await _body(contents)
        turns = Turns()
        assert await _parts(_reader(body, content_type, turns), part_bytes) == contents
        assert sum(turns.read.values()) < len(body) + len(contents) * (32 << 10)  # aiohttp's own reads are 8 KiB

    asyncio.run(check())
