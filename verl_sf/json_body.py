"""A request body's JSON, parsed to a bounded depth and size of structure: one rule for every API the server speaks."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from verl_sf.errors import InputError
from verl_sf.executor.zygote.wire import (
    JSON_STRING,
    JSON_TOKEN,
    MAX_DEPTH,
    MAX_OUTSIDE_STRINGS,
    MAX_TOKENS,
    deeper_than,
)
from verl_sf.json_pieces import BulkOutsideStrings, PastTheCap, decode
from verl_sf.off_loop import OFF_LOOP_BYTES, PIECE_CHARS, off_loop

MAX_JSON_DEPTH = MAX_DEPTH
"""Nesting a request body may have (Ruby's JSON default; the zygote's lines have the same): the
wire formats need 4, and past it the parsers' recursion, not the request, would decide what happens."""


MAX_JSON_TOKENS = MAX_TOKENS
"""Strings, separators (`,` `:`) and opening brackets a request body may hold.  `json.loads` is one
C call that holds the GIL, and with it the server's event loop, for as long as it parses (~0.5 us a
token): a 63 MiB body of seven million one-letter keys held every client for 6-39 s (red team,
2026-12-06), and 18 MiB of 99,000 lists each nested 99 deep (ten million lists) 8.5 s and a GB
(2026-12-07).  The APIs' bodies need a few per file, cell, label or field; their bulk is in strings,
each one token.  A body of a MiB or more is also refused past MAX_OUTSIDE_STRINGS (the zygote's records
have both caps: `wire.bulk_of`)."""
_TOKENS_BYTES = re.compile(JSON_TOKEN.pattern.encode())
# A string, or brackets opening one inside another (whitespace between): each run whole, so a run's length is
# how deep it nests at least.
_RUNS = re.compile(rf"{JSON_STRING}|[\[{{]\s*+(?:[\[{{]\s*+)*+".encode())


class JsonBodyError(InputError):
    """A request body that is not JSON, JSON nested past MAX_JSON_DEPTH, or holding more than MAX_JSON_TOKENS."""


def load_json(raw: bytes | str) -> Any:
    """`json.loads`, with a body of more than MAX_JSON_TOKENS refused before it is parsed and one nested
    past MAX_JSON_DEPTH refused rather than recursed into; a body of a MiB or more is decoded a piece at
    a time (json_pieces.py) and refused past MAX_OUTSIDE_STRINGS as well."""
    too_deep = JsonBodyError(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(raw, str) and len(raw) >= OFF_LOOP_BYTES and not raw.startswith("\ufeff"):  # a WebSocket's text
        raw = b"".join(raw[at:at + PIECE_CHARS].encode("utf-8", "surrogatepass")
                       for at in range(0, len(raw), PIECE_CHARS))
    try:
        if isinstance(raw, bytes) and len(raw) >= OFF_LOOP_BYTES:
            body = decode(raw, MAX_JSON_TOKENS, MAX_OUTSIDE_STRINGS)  # a piece at a time, counting as it goes
        else:
            past = _past_the_token_cap(raw)
            if past is not None:
                raise PastTheCap(raw[:past] if isinstance(raw, bytes) else raw[:past].encode("utf-8", "surrogatepass"))
            body = json.loads(raw)
    except PastTheCap as exc:
        if _nests_too_deep_before(exc.skeleton):  # brackets alone, one inside another: the depth is what is wrong
            raise too_deep from None
        raise JsonBodyError(f"request body holds more than {MAX_JSON_TOKENS:,} JSON tokens (strings, separators and "
                            "brackets): put bulk in strings (files, code, stdin), not in many small values") from None
    except BulkOutsideStrings as exc:
        raise JsonBodyError(f"request body holds {exc} (numbers, brackets, literals): put bulk in strings") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300 digits
        raise JsonBodyError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the interpreter's stack, so far past the limit
        raise too_deep from None
    if deeper_than(body, MAX_JSON_DEPTH):
        raise too_deep
    return body


def _past_the_token_cap(raw: bytes | str) -> int | None:
    """None where `raw` has at most MAX_JSON_TOKENS, else where the token one past the cap ends.  Every
    string is a key before a `:`, or a value after a `:`, `,` or `[`, or the whole body, so counts of
    those characters and of the opening brackets wherever they are bound the tokens, and most bodies
    stop there.  Else the tokens are counted, until one past the cap (a string matched whole, at C
    speed)."""
    tokens: Iterator[re.Match[Any]]
    if isinstance(raw, bytes):
        bound = 3 * raw.count(b":") + 2 * raw.count(b",") + 2 * raw.count(b"[") + raw.count(b"{") + 1
        tokens = _TOKENS_BYTES.finditer(raw)
    else:
        bound = 3 * raw.count(":") + 2 * raw.count(",") + 2 * raw.count("[") + raw.count("{") + 1
        tokens = JSON_TOKEN.finditer(raw)
    if bound <= MAX_JSON_TOKENS:
        return None
    past = next(itertools.islice(tokens, MAX_JSON_TOKENS, None), None)  # the first past the cap, if there is one
    return past.end() if isinstance(past, re.Match) else None


def _nests_too_deep_before(head: bytes) -> bool:
    """Whether, in a body's first MAX_JSON_TOKENS tokens, brackets open past MAX_JSON_DEPTH one inside
    another outside any string: a run of them, among the strings and runs."""
    runs = (match.group() for match in _RUNS.finditer(head))
    return any(run[:1] != b'"' and run.count(b"[") + run.count(b"{") > MAX_JSON_DEPTH for run in runs)


async def request_json(request: web.Request) -> Any:
    """`request.json()`, parsed in a thread when the body is large and to a bounded depth;
    JsonBodyError (a ValueError) when it is not JSON or nests too deep."""
    return await load_json_off_loop(await request.read())


async def load_json_off_loop(raw: bytes) -> Any:
    """`load_json`, in a thread when `raw` is large."""
    return await off_loop(len(raw), load_json, raw)
