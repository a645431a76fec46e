"""Work on a large JSON document (a request body, a zygote's request or reply) is done in a thread,
so that the event loop, and with it every other client, gets its turns while one client's 60 MB is
parsed or encoded.  Only between C calls: one call on a string of tens of MB holds the GIL
throughout, so long strings are encoded, searched and decoded a piece at a time (and bulky data is
better kept out of JSON: e2b/sandboxes.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

OFF_LOOP_BYTES = 1 << 20  # documents this large are parsed or encoded in a thread
PIECE_CHARS = 1 << 20  # a long string is encoded (or searched) this much at a time: ~5 ms of the GIL each
LONG_STRING = 64  # bytes: a body's strings this long are decoded apart from its structure, a piece at a time
T = TypeVar("T")
# A whole string, and a string's content token by token: text, an escape, where a high surrogate's
# escape is one with a low one right after it (JSON joins them) and else only once what follows it
# is seen, so a piece's end never parts them.
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')
_CONTENT = re.compile(rb"(?:[^\"\\]++|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2}"
                      rb"|(?=[^\\]|\\[^u]|\\u(?![dD][c-fC-F])[0-9a-fA-F]{4}))|\\u(?![dD][89abAB])[0-9a-fA-F]{4}|\\[^u])*+")
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
    short strings) is parsed at once and the strings put back.  A body that is not UTF-8 (JSON's
    UTF-16 and UTF-32) is parsed at once.  Errors are ValueError, as `json.loads` raises them."""
    if json.detect_encoding(raw[:4]) != "utf-8":
        return json.loads(raw)
    skeleton: list[bytes] = []
    strings: dict[str, str] = {}
    tag = secrets.token_hex(16)
    at, size = 0, len(raw)
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


def _string_at(raw: bytes, start: int) -> tuple[str, int]:
    """The string whose opening quote is at `start`, decoded a piece at a time, and where it ends.  A
    piece ends after a whole escape and a whole UTF-8 character."""
    parts = []
    at = start + 1
    while True:
        match = _CONTENT.match(raw, at, at + max(PIECE_CHARS, 16))  # room for a surrogate pair, whatever the piece
        end = match.end() if match is not None else at  # it always matches, if only nothing
        closed = raw[end:end + 1] == b'"'
        if not closed and end < len(raw):
            while end > at and raw[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte: inside a character
                end -= 1
        try:
            if end == at and not closed:  # nothing decodable here: json.loads says what is wrong with it
                json.loads('"' + raw[at:at + 16].decode("utf-8", "replace"))
                raise ValueError("Unterminated string")  # never reached: what stops the match is not JSON
            parts.append(json.loads('"' + raw[at:end].decode("utf-8", "surrogatepass") + '"'))
        except ValueError as exc:  # positions in a piece would mislead: the string's own is said instead
            raise ValueError(f"{getattr(exc, 'msg', exc)} in the string starting at byte {start}") from None
        if closed:
            return "".join(parts), end + 1
        at = end


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
