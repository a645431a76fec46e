"""A request body's JSON, parsed to a bounded depth and size of structure: one rule for every API the server speaks."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from verl_sf.errors import InputError
from verl_sf.executor.zygote.wire import MAX_DEPTH, deeper_than
from verl_sf.off_loop import off_loop

MAX_JSON_DEPTH = MAX_DEPTH
"""Nesting a request body may have (Ruby's JSON default; the zygote's lines have the same): the
wire formats need 4, and past it the parsers' recursion, not the request, would decide what happens."""


MAX_JSON_TOKENS = 100_000
"""Strings and separators (`,` `:`) a request body may hold (brackets without either only nest,
which MAX_JSON_DEPTH bounds).  `json.loads` is one
C call that holds the GIL, and with it the server's event loop, for as long as it parses (~0.5 us a
token): a 63 MiB body of seven million one-letter keys held every client for 6-39 s (red team,
2026-12-06).  The APIs' bodies need a few per file, cell, label or field; their bulk is in strings,
each one token."""
_TOKENS_BYTES = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[,:]')
_TOKENS_TEXT = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[,:]')


class JsonBodyError(InputError):
    """A request body that is not JSON, JSON nested past MAX_JSON_DEPTH, or holding more than MAX_JSON_TOKENS."""


def load_json(raw: bytes | str) -> Any:
    """`json.loads`, with a body of more than MAX_JSON_TOKENS refused before it is parsed and one nested
    past MAX_JSON_DEPTH refused rather than recursed into."""
    too_deep = JsonBodyError(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    if not _few_tokens(raw):
        raise JsonBodyError(f"request body holds more than {MAX_JSON_TOKENS:,} JSON tokens (strings and "
                            f"separators): put bulk in strings (files, code, stdin), not in many small values")
    try:
        body = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300 digits
        raise JsonBodyError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the interpreter's stack, so far past the limit
        raise too_deep from None
    if deeper_than(body, MAX_JSON_DEPTH):
        raise too_deep
    return body


def _few_tokens(raw: bytes | str) -> bool:
    """Whether `raw` has at most MAX_JSON_TOKENS.  Every string is a key before a `:`, or a value after
    a `:`, `,` or `[`, or the whole body, so counts of those characters wherever they are bound the
    tokens, and most bodies stop there.  Else the tokens are counted, until one past the cap (a
    string matched whole, at C speed)."""
    tokens: Iterator[object]
    if isinstance(raw, bytes):
        bound = 3 * raw.count(b":") + 2 * raw.count(b",") + raw.count(b"[") + 1
        tokens = _TOKENS_BYTES.finditer(raw)
    else:
        bound = 3 * raw.count(":") + 2 * raw.count(",") + raw.count("[") + 1
        tokens = _TOKENS_TEXT.finditer(raw)
    if bound <= MAX_JSON_TOKENS:
        return True
    return next(itertools.islice(tokens, MAX_JSON_TOKENS, None), None) is None


async def request_json(request: web.Request) -> Any:
    """`request.json()`, parsed in a thread when the body is large and to a bounded depth;
    JsonBodyError (a ValueError) when it is not JSON or nests too deep."""
    raw = await request.read()
    return await off_loop(len(raw), load_json, raw)
