"""Compressed request bodies, inflated by the server a piece at a time up to its limit (verl_sf/server/inflate.py)."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from verl_sf.server.inflate import PIECE_BYTES, BodyTooLarge, UndecodableBody, encoding_of, inflate

TEXT = b'{"code": "print(1)", "language": "python"}' * 1000


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(("header", "expected"), [("gzip", "gzip"), ("GZip", "gzip"), ("deflate", "deflate"),
                                                  ("br", "br"), ("zstd", "zstd"), ("x-gzip", None), ("identity", None),
                                                  ("gzip, deflate", None), ("", None), ("gzıp", None)])
def test_the_encodings_inflated_are_the_ones_aiohttp_reads(header: str, expected: str | None) -> None:
    assert encoding_of(header) == expected


def test_gzip_and_both_shapes_of_deflate_inflate_whole() -> None:
    noise = os.urandom(3 * PIECE_BYTES)  # more than a piece, and no smaller once compressed
    for data in (TEXT, noise, b""):
        assert inflate(gzip.compress(data), "gzip", len(data)) == data
        assert inflate(zlib.compress(data), "deflate", len(data)) == data
        assert inflate(raw_deflate(data), "deflate", len(data)) == data


def test_gzip_members_one_after_another_inflate_as_one_body() -> None:
    assert inflate(gzip.compress(b"first ") + gzip.compress(b"second"), "gzip", 100) == b"first second"


def test_past_the_limit_by_one_byte_is_too_large_and_at_it_is_not() -> None:
    data = b"0" * (5 * PIECE_BYTES + 7)
    assert inflate(gzip.compress(data), "gzip", len(data)) == data
    with pytest.raises(BodyTooLarge):
        inflate(gzip.compress(data), "gzip", len(data) - 1)


def test_a_bomb_is_refused_after_inflating_little_past_the_limit() -> None:
    """256 MiB of zeros in ~250 KB of gzip: refused once a piece past the limit is out, not inflated whole."""
    compressor = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS)
    chunk = b"\0" * (64 << 20)
    bomb = b"".join(compressor.compress(chunk) for _ in range(4)) + compressor.flush()
    with pytest.raises(BodyTooLarge):
        inflate(bomb, "gzip", 2 * PIECE_BYTES)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_broken_or_cut_short_data_is_undecodable(encoding: str) -> None:
    whole = gzip.compress(TEXT) if encoding == "gzip" else zlib.compress(TEXT)
    for data in (b"not compressed at all", whole[: len(whole) // 2], whole[:-9]):
        with pytest.raises(UndecodableBody, match=f"Can not decode content-encoding: {encoding}"):
            inflate(data, encoding, len(TEXT))


def test_trailing_garbage_after_a_gzip_member_is_undecodable() -> None:
    with pytest.raises(UndecodableBody):
        inflate(gzip.compress(TEXT) + b"garbage", "gzip", len(TEXT))


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_an_encoding_this_server_does_not_inflate_says_which_it_does(encoding: str) -> None:
    with pytest.raises(UndecodableBody, match=f"{encoding} .this server inflates gzip and deflate"):
        inflate(b"anything", encoding, 100)
