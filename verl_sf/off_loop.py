"""Work on a large JSON document (a request body, a zygote's request or reply) is done in a thread,
so that the event loop, and with it every other client, gets its turns while one client's 60 MB is
parsed or encoded.  Only between the C parser's or encoder's steps: one string of tens of MB is one
step, which holds the GIL throughout (so bulky data is better kept out of JSON: e2b/sandboxes.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

OFF_LOOP_BYTES = 1 << 20  # documents this large are parsed or encoded in a thread
T = TypeVar("T")


async def off_loop(size: int, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)`, in a thread when the document it works on is `size` bytes or more."""
    if size >= OFF_LOOP_BYTES:
        return await asyncio.to_thread(function, *args)
    return function(*args)


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
