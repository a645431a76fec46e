"""Request bodies sent compressed (`Content-Encoding: gzip` or `deflate`: E2B's SDK uploads files so),
inflated by the server itself rather than by aiohttp: in a thread, a piece at a time, and only as
far as the body limit.  aiohttp inflates on the event loop as a body arrives, and a gzip bomb of
80 KB (64 MiB of zeros) held every other client ~0.3 s, four senders of them ~1 s a request
(docs/security.md, "Compressed bodies")."""

from __future__ import annotations

import zlib
from typing import Optional

from verl_sf.errors import InputError

PIECE_BYTES = 1 << 20  # inflated a MiB at a time: zlib frees the GIL only inside each call
ENCODINGS = ("gzip", "deflate", "br", "zstd")  # the ones aiohttp decodes; any other passes as sent
INFLATED = ("gzip", "deflate")


class BodyTooLarge(InputError):
    """The body (inflated, where it is compressed) is larger than the limit."""


class UndecodableBody(InputError):
    """The body is not what its encoding says, or is in one this server does not inflate."""


def encoding_of(header: str) -> Optional[str]:
    """The encoding a body is inflated from, as aiohttp reads `Content-Encoding` (one of ENCODINGS, any
    case), or None: the body is taken as it is."""
    if not header.isascii():
        return None
    encoding = header.lower()
    return encoding if encoding in ENCODINGS else None


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` inflated from `encoding` (gzip: members one after another; deflate: zlib's format or a bare
    deflate stream, told apart as aiohttp does), at most `limit` bytes; BodyTooLarge past it, and
    UndecodableBody for data that is broken or cut short."""
    if encoding not in INFLATED:
        raise UndecodableBody(f"Can not decode content-encoding: {encoding} (this server inflates gzip and deflate)")
    if not data:
        return b""
    wbits = _window_bits(data, encoding)
    pieces: list[bytes] = []
    size = 0
    decompressor = zlib.decompressobj(wbits)
    pending = data
    try:
        while True:
            piece = decompressor.decompress(pending, PIECE_BYTES)
            size += len(piece)
            if size > limit:
                raise BodyTooLarge(f"inflates past {limit} bytes")
            pieces.append(piece)
            pending = decompressor.unconsumed_tail
            if decompressor.eof:
                pending = decompressor.unused_data
                if not pending or encoding != "gzip":
                    break
                decompressor = zlib.decompressobj(wbits)  # the next gzip member
            elif not pending and len(piece) < PIECE_BYTES:
                break  # all read and nothing held back: cut short
    except zlib.error:
        raise UndecodableBody(f"Can not decode content-encoding: {encoding}") from None
    if not decompressor.eof:
        raise UndecodableBody(f"Can not decode content-encoding: {encoding} (the data ends early)")
    return b"".join(pieces)


def _window_bits(data: bytes, encoding: str) -> int:
    """zlib's `wbits` for the stream: gzip's header, zlib's (RFC 1950, whose first byte names method 8 in
    its low bits), or none at all (a bare deflate stream, which some clients send as `deflate`)."""
    if encoding == "gzip":
        return 16 + zlib.MAX_WBITS
    return zlib.MAX_WBITS if data[0] & 0xF == 8 else -zlib.MAX_WBITS
