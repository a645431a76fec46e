"""A large JSON body decoded with no C call on much more than a piece of it: in a thread, the GIL
(and with it the event loop) is free between pieces, where `json.loads` holds it for the whole body
(~70 ms for 50 MB).  Its tokens and the bytes outside its strings are counted as it goes, so a body
past either cap is refused before any of it is parsed at once."""

from __future__ import annotations

import codecs
import json
import re
import secrets
from json.decoder import scanstring  # type: ignore[attr-defined]  # JSON's string scanner, in C
from typing import Any

from verl_sf.errors import InputError
from verl_sf.executor.zygote.wire import JSON_STRING
from verl_sf.off_loop import PIECE_CHARS

LONG_STRING = 64  # bytes: strings this long are decoded apart from the body's structure, a piece at a time
_STRING = re.compile(JSON_STRING.encode())
_HIGH_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")  # JSON joins it with a low one right after
_LOW_ESCAPE = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_BLANKS = re.compile(rb"[ \t\n\r]++")
_TOKEN_CHARACTERS = b",:[{"  # beside strings, what a token cap counts


class PastTheCap(InputError):
    """More tokens than the cap: `skeleton` is the body up to there, its long strings stood in for."""

    def __init__(self, skeleton: bytes):
        super().__init__("past the token cap")
        self.skeleton = skeleton


class BulkOutsideStrings(InputError):
    """More bytes outside the body's strings (numbers, brackets, literals; blank runs counted as one)
    than the cap: Python converts a long integer in time that grows as its digits squared."""


def decode(raw: bytes, max_tokens: int, max_outside: int) -> Any:
    """`json.loads(raw)` a piece at a time.  Strings of LONG_STRING bytes or more are decoded apart, by
    JSON's own string scanner a piece at a time, and stand in the body as placeholders no client can
    guess; blank runs shrink to one; the rest (structure, numbers, short strings) is parsed at once and
    the strings put back.  A body in UTF-16 or UTF-32 (which `json.loads` reads too) is made UTF-8
    first.  PastTheCap past `max_tokens` strings, `,`, `:` and opening brackets; BulkOutsideStrings
    past `max_outside`; else ValueError where `json.loads` raises it."""
    encoding = json.detect_encoding(raw[:4])
    if encoding.startswith(("utf-16", "utf-32")):
        raw = _utf8(raw, encoding)
    skeleton: list[bytes] = []
    strings: dict[str, str] = {}
    tag = secrets.token_hex(16)
    tokens = outside = 0
    at, size = 3 if encoding == "utf-8-sig" else 0, len(raw)  # past a byte order mark, as json.loads reads it
    while at < size:
        limit = at + PIECE_CHARS
        quote = raw.find(b'"', at, limit)
        between = _BLANKS.sub(b" ", raw[at:limit if quote < 0 else quote])
        skeleton.append(between)
        tokens += len(between) - len(between.translate(None, _TOKEN_CHARACTERS)) + (quote >= 0)
        outside += len(between)
        if tokens > max_tokens:
            raise PastTheCap(b"".join(skeleton))
        if outside > max_outside:
            raise BulkOutsideStrings(f"more than {max_outside:,} bytes outside its strings")
        if quote < 0:
            at = limit
            continue
        short = _STRING.match(raw, quote, quote + LONG_STRING)
        if short is not None:
            skeleton.append(raw[quote:short.end()])
            at = short.end()
            continue
        value, at = _string_at(raw, quote)
        placeholder = f"{tag}:{len(strings)}"
        strings[placeholder] = value
        skeleton.append(b'"' + placeholder.encode() + b'"')
    try:
        body = json.loads(b"".join(skeleton))
    except json.JSONDecodeError as exc:  # its position is the skeleton's, not the body's
        raise ValueError(exc.msg) from None
    return _put_back(body, strings) if strings else body


def _utf8(raw: bytes, encoding: str) -> bytes:
    """`raw.decode(encoding).encode()` a piece at a time, lone surrogates kept (as `json.loads` decodes)."""
    decoder = codecs.getincrementaldecoder(encoding)("surrogatepass")
    pieces = [decoder.decode(raw[at:at + PIECE_CHARS]).encode("utf-8", "surrogatepass")
              for at in range(0, len(raw), PIECE_CHARS)]
    pieces.append(decoder.decode(b"", final=True).encode("utf-8", "surrogatepass"))
    return b"".join(pieces)


def _string_at(raw: bytes, start: int) -> tuple[str, int]:
    """The string whose opening quote is at `start`, decoded a piece at a time by JSON's own string
    scanner (which stops at its closing quote), and where it ends."""
    parts = []
    at, size = start + 1, len(raw)
    while True:
        limit = at + max(PIECE_CHARS, 32)
        whole = _STRING.match(raw, start, limit) if at == start + 1 else None  # most end within a piece
        cut = whole.end() if whole is not None else size if limit >= size else _cut(raw, at, limit)
        piece = raw[at:cut]
        try:
            text = piece.decode("utf-8", "surrogatepass") + '"'
            value, end = scanstring(text, 0)
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 ({exc.reason}) at byte {at + exc.start}") from None
        except json.JSONDecodeError as exc:  # positions in the piece, told as the body's
            where = at + len(text[:exc.pos].encode("utf-8", "surrogatepass"))
            raise ValueError(f"{exc.msg.removesuffix(' at')} at byte {where}") from None
        parts.append(value)
        if end < len(text):  # its closing quote is in this piece
            quote = at + (end - 1 if text.isascii() else len(text[:end - 1].encode("utf-8", "surrogatepass")))
            return "".join(parts), quote + 1
        if cut == size:
            raise ValueError(f"Unterminated string starting at byte {start}")
        at = cut


def _cut(raw: bytes, at: int, limit: int) -> int:
    """Where a piece of a string that starts at `at` (between two characters and two escapes) may end,
    near `limit`: not inside a UTF-8 character or an escape, and not between a surrogate pair's two."""
    slash = raw.rfind(b"\\", limit - 16, limit)
    if slash < 0:  # no escape reaches `limit`
        cut = limit
        while cut > limit - 3 and raw[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: back to its character's first
            cut -= 1
        return cut
    run = slash  # the first of the backslashes that end at `slash`: an escape starts there
    while run > at:
        seen = raw[max(at, run - 4096):run]
        stripped = seen.rstrip(b"\\")
        run -= len(seen) - len(stripped)
        if stripped:
            break
    if run == at:  # backslashes all the way from `at`: cut after an even number of them, escaped backslashes
        return at + (slash - at) // 2 * 2
    if run - 6 >= at and _HIGH_ESCAPE.fullmatch(raw, run - 6, run) and _LOW_ESCAPE.match(raw, run):
        return run + 6  # after the pair
    return run


def _put_back(body: Any, strings: dict[str, str]) -> Any:
    """`body` with each placeholder, as a value or a key, replaced by its string; without recursion."""
    if isinstance(body, str):
        return strings.get(body, body)
    level = [body] if isinstance(body, (dict, list)) else []
    while level:
        node = level.pop()
        if isinstance(node, dict):
            if any(key in strings for key in node):
                pairs = [(strings.get(key, key), value) for key, value in node.items()]
                node.clear()
                node.update(pairs)  # a repeated key keeps its first place and its last value, as json.loads does
            slots: Any = node.items()
        else:
            slots = enumerate(node)
        for slot, value in list(slots):
            if isinstance(value, str):
                if value in strings:
                    node[slot] = strings[value]
            elif isinstance(value, (dict, list)):
                level.append(value)
    return body
