"""Work on a large JSON document (a request body, a zygote's request or reply) is done in a thread,
so that the event loop, and with it every other client, gets its turns while one client's 60 MB is
parsed or encoded.  Only between C calls: one call on a string of tens of MB holds the GIL
throughout, so long strings are encoded, searched and decoded a piece at a time (and bulky data is
better kept out of JSON: e2b/sandboxes.py)."""

from __future__ import annotations

import asyncio
import base64
import codecs
import json
import re
import secrets
from collections.abc import Callable, Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]  # JSON's string scanner, in C
from typing import Any, TypeVar

OFF_LOOP_BYTES = 1 << 20  # documents this large are parsed or encoded in a thread
PIECE_CHARS = 1 << 20  # a long string is encoded (or searched) this much at a time: ~5 ms of the GIL each
LONG_STRING = 64  # bytes: a body's strings this long are decoded apart from its structure, a piece at a time
T = TypeVar("T")
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')  # a whole string
_HIGH_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")  # JSON joins it with a low one right after
_LOW_ESCAPE = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_BLANKS = re.compile(rb"[ \t\n\r]++")


async def off_loop(size: int, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)`, in a thread when the document it works on is `size` bytes or more."""
    if size >= OFF_LOOP_BYTES:
        return await asyncio.to_thread(function, *args)
    return function(*args)


def json_bytes(document: Mapping[str, Any]) -> bytes:
    """`json.dumps(document).encode()`, with each long string at the top and one level down encoded
    a piece at a time: in a thread, the GIL (and with it the event loop) is free between pieces,
    where `json.dumps` holds it for a whole string (~150 ms for 50 MB).  The pieces are joined as
    bytes, which lets the GIL go while it copies (joining them as text held it ~100 ms for 50 MB)."""
    if text_size(document) < OFF_LOOP_BYTES:
        return json.dumps(document).encode()
    parts: list[bytes] = []
    _object(document, _value, parts)
    return b"".join(parts)


def _object(items: Mapping[str, Any], encode: Callable[[Any, list[bytes]], None], parts: list[bytes]) -> None:
    parts.append(b"{")
    for number, (key, value) in enumerate(items.items()):
        parts.append(b"%s%s: " % (b", " if number else b"", json.dumps(key).encode()))
        encode(value, parts)
    parts.append(b"}")


def _value(value: Any, parts: list[bytes]) -> None:
    """A top-level value: its strings, or those of the object or list it is, encoded in pieces."""
    if isinstance(value, dict):
        _object(value, _leaf, parts)
    elif isinstance(value, list):
        parts.append(b"[")
        for number, item in enumerate(value):
            if number:
                parts.append(b", ")
            _leaf(item, parts)
        parts.append(b"]")
    else:
        _leaf(value, parts)


def _leaf(value: Any, parts: list[bytes]) -> None:
    if not isinstance(value, str) or len(value) < PIECE_CHARS:
        parts.append(json.dumps(value).encode())
        return
    # Escapes are per character (a character outside the BMP is one str index, two escapes), so any cut is safe.
    parts.append(b'"')
    parts.extend(json.dumps(value[at:at + PIECE_CHARS])[1:-1].encode() for at in range(0, len(value), PIECE_CHARS))
    parts.append(b'"')


def base64_of(data: bytes) -> str:
    """`data` in base64, encoded a piece at a time: in a thread, the GIL is free between pieces
    (50 MB at once held it ~150 ms)."""
    step = 3 * PIECE_CHARS  # a multiple of 3: the pieces' base64 joined is the whole's
    return "".join(base64.b64encode(data[at:at + step]).decode() for at in range(0, len(data), step))


def text_size(document: Mapping[str, Any]) -> int:
    """How many characters its strings hold, at the top and one level down (code, stdin, cells,
    files): what a request body's size comes from."""
    size = 0
    for value in document.values():
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, (dict, list)):
            items = value.values() if isinstance(value, dict) else value
            size += sum(len(item) for item in items if isinstance(item, str))
    return size


def json_value(raw: bytes) -> Any:
    """`json.loads(raw)`, with no C call on much more than a piece of it: in a thread, the GIL is free
    between pieces, where `json.loads` holds it for the whole body (~70 ms for 50 MB).  Strings of
    LONG_STRING bytes or more are decoded apart, each a piece at a time, and stand in the body as
    placeholders no client can guess; runs of blanks shrink to one; the rest (structure, numbers,
    short strings) is parsed at once and the strings put back.  A body in UTF-16 or UTF-32 (which
    `json.loads` reads too) is made UTF-8 first, a piece at a time.  Errors are ValueError, as
    `json.loads` raises them."""
    encoding = json.detect_encoding(raw[:4])
    if encoding.startswith(("utf-16", "utf-32")):
        raw = _utf8(raw, encoding)
    skeleton: list[bytes] = []
    strings: dict[str, str] = {}
    tag = secrets.token_hex(16)
    at, size = 3 if encoding == "utf-8-sig" else 0, len(raw)  # past a byte order mark, as json.loads reads it
    while at < size:
        limit = at + PIECE_CHARS
        quote = raw.find(b'"', at, limit)
        skeleton.append(_BLANKS.sub(b" ", raw[at:limit if quote < 0 else quote]))
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
        try:
            text = raw[at:cut].decode("utf-8", "surrogatepass") + '"'
            value, end = scanstring(text, 0)
        except ValueError as exc:  # positions in a piece would mislead: the string's own is said instead
            raise ValueError(f"{getattr(exc, 'msg', exc)} in the string starting at byte {start}") from None
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
