"""Pages of a listing that stay right while it changes (E2B's and Daytona's sandbox lists).

A cursor is the sort key of the last item a page gave, so the next page starts after that item
whatever ended or started meanwhile: an offset would skip an item for every one that ended on an
earlier page.  Keys are (time stamp, id) strings: ISO times of one format sort as they read.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Optional, TypeVar

from verl_sf.errors import InputError

Item = TypeVar("Item")
Key = tuple[str, str]
MAX_CURSOR_CHARS = 1024
NOT_A_CURSOR = "not a cursor: a page's X-Next-Token or nextCursor, as given"


class BadCursor(InputError):
    """A cursor that does not decode as one (a position in the list: a start time and an id)."""


def page(items: Sequence[Item], key: Callable[[Item], Key], cursor: Optional[str],
         limit: Optional[int]) -> tuple[list[Item], Optional[str]]:
    """The items after `cursor` (all of them without one), at most `limit`, and the next page's cursor."""
    ordered = sorted(items, key=key)
    if cursor:
        after = _decode(cursor)
        ordered = [item for item in ordered if key(item) > after]
    count = limit or len(ordered)
    shown = ordered[:count]
    return shown, (_encode(key(shown[-1])) if len(ordered) > count else None)


def _encode(key: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def _decode(cursor: str) -> Key:
    if len(cursor) > MAX_CURSOR_CHARS or not cursor.isascii():
        raise BadCursor(NOT_A_CURSOR)
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise BadCursor(NOT_A_CURSOR) from None
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(part, str) for part in key)):
        raise BadCursor(NOT_A_CURSOR)
    return key[0], key[1]
