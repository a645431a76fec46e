"""A request body's JSON, parsed to a bounded depth: one rule for every API the server speaks."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from verl_sf.errors import InputError
from verl_sf.executor.zygote.wire import MAX_DEPTH, deeper_than
from verl_sf.off_loop import off_loop

MAX_JSON_DEPTH = MAX_DEPTH
"""Nesting a request body may have (Ruby's JSON default; the zygote's lines have the same): the
wire formats need 4, and past it the parsers' recursion, not the request, would decide what happens."""


class JsonBodyError(InputError):
    """A request body that is not JSON, or JSON nested past MAX_JSON_DEPTH."""


def load_json(raw: bytes | str) -> Any:
    """`json.loads`, with a body nested past MAX_JSON_DEPTH refused rather than recursed into."""
    too_deep = JsonBodyError(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300 digits
        raise JsonBodyError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the interpreter's stack, so far past the limit
        raise too_deep from None
    if deeper_than(body, MAX_JSON_DEPTH):
        raise too_deep
    return body


async def request_json(request: web.Request) -> Any:
    """`request.json()`, parsed in a thread when the body is large and to a bounded depth;
    JsonBodyError (a ValueError) when it is not JSON or nests too deep."""
    raw = await request.read()
    return await off_loop(len(raw), load_json, raw)
