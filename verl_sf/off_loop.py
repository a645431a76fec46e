"""Work on a large JSON document (a request body, a zygote's request or reply) is done in a thread,
so that the event loop, and with it every other client, gets its turns while one client's 60 MB is
parsed or encoded.  Only between C calls: one call on a string of tens of MB holds the GIL
throughout, so long strings are encoded and searched a piece at a time (decoded: json_pieces.py;
and bulky data is better kept out of JSON: e2b/sandboxes.py).  One thread per event loop does it
all, one document after another: the loop waits for the GIL behind each thread that holds it, so
six threads (asyncio's default) at once held every other client six times as long."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

OFF_LOOP_BYTES = 1 << 20  # documents this large are parsed or encoded in a thread
PIECE_CHARS = 1 << 20  # a long string is encoded (or searched) this much at a time: ~5 ms of the GIL each
T = TypeVar("T")
_THREADS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ThreadPoolExecutor] = weakref.WeakKeyDictionary()


async def off_loop(size: int, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)`, in the loop's one thread for large documents when this one is `size` bytes or more."""
    if size < OFF_LOOP_BYTES:
        return function(*args)
    loop = asyncio.get_running_loop()
    thread = _THREADS.get(loop)
    if thread is None:  # per loop: a process forked from this one has a loop, and none of its threads
        thread = _THREADS[loop] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-sf-off-loop")
    return await loop.run_in_executor(thread, functools.partial(function, *args))


def json_bytes(document: Mapping[str, Any]) -> bytes:
    """`json.dumps(document).encode()`; where its strings at the top and one level down hold a MiB or
    more, `encoded`."""
    if text_size(document) < OFF_LOOP_BYTES:
        return json.dumps(document).encode()
    return encoded(document)


def encoded(value: Any) -> bytes:
    """`json.dumps(value).encode()`, with each long string, at any depth, encoded a piece at a time: in
    a thread, the GIL (and with it the event loop) is free between pieces, where `json.dumps` holds it
    for a whole string (~150 ms for 50 MB).  The pieces are joined as bytes, which lets the GIL go
    while it copies (joining them as text held it ~100 ms for 50 MB)."""
    parts: list[bytes] = []
    _encode(value, parts)
    return b"".join(parts)


def _encode(value: Any, parts: list[bytes]) -> None:
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        parts.append(b"{")
        for number, (key, item) in enumerate(value.items()):
            parts.append(b"%s%s: " % (b", " if number else b"", json.dumps(key).encode()))
            _encode(item, parts)
        parts.append(b"}")
    elif isinstance(value, list):
        parts.append(b"[")
        for number, item in enumerate(value):
            if number:
                parts.append(b", ")
            _encode(item, parts)
        parts.append(b"]")
    elif isinstance(value, str) and len(value) >= PIECE_CHARS:
        # Escapes are per character (a character outside the BMP is one str index, two escapes): any cut is safe.
        parts.append(b'"')
        parts.extend(json.dumps(value[at:at + PIECE_CHARS])[1:-1].encode() for at in range(0, len(value), PIECE_CHARS))
        parts.append(b'"')
    else:
        parts.append(json.dumps(value).encode())


def bytes_of(text: str) -> bytes:
    """`base64.b64decode(text)` (no blanks in it) a piece at a time, joined as bytes (which lets the GIL
    go while it copies)."""
    step = 4 * PIECE_CHARS  # a multiple of 4: the pieces' bytes joined are the whole's
    return b"".join(base64.b64decode(text[at:at + step]) for at in range(0, len(text), step))


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
