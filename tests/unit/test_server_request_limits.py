"""The server's pure limits: how deep a JSON body may nest, how many connections fit the open-files limit."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from verl_sf.executor.zygote import wire
from verl_sf.json_body import MAX_JSON_DEPTH, JsonBodyError, load_json
from verl_sf.server.connections import connection_cap


def nested_lists(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def nested_mixed(depth: int) -> bytes:
    """Objects and lists in turn, with scalars beside them: `depth` containers deep."""
    raw = b"{}"
    for level in range(depth - 1):
        raw = b'{"k": ' + raw + b', "n": 1}' if level % 2 else b'[1, "x", ' + raw + b"]"
    return raw


@pytest.mark.parametrize("nested", [nested_lists, nested_mixed])
def test_json_as_deep_as_the_limit_parses_and_one_level_more_is_refused(nested: Callable[[int], bytes]) -> None:
    assert load_json(nested(MAX_JSON_DEPTH)) == json.loads(nested(MAX_JSON_DEPTH))
    with pytest.raises(JsonBodyError, match=f"nests JSON deeper than {MAX_JSON_DEPTH} levels"):
        load_json(nested(MAX_JSON_DEPTH + 1))


def test_json_deeper_than_the_interpreter_stack_is_refused_the_same_way() -> None:
    with pytest.raises(JsonBodyError, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        load_json(b"[" * 200_000)


@pytest.mark.parametrize("nested", [nested_lists, nested_mixed])
def test_the_zygotes_lines_have_the_same_limit(nested: Callable[[int], bytes]) -> None:
    """A run's records reach the zygote through wire.loads: one nested past its stack, or near it
    (its reply would nest deeper still), is a ValueError the zygote drops as garbage."""
    assert wire.loads(nested(MAX_JSON_DEPTH).decode()) == json.loads(nested(MAX_JSON_DEPTH))
    for raw in (nested(MAX_JSON_DEPTH + 1), nested(990), nested_lists(200_000)):
        with pytest.raises(ValueError, match=f"JSON nested deeper than {MAX_JSON_DEPTH} levels"):
            wire.loads(raw.decode())


@pytest.mark.parametrize("raw, parsed", [(b'"text"', "text"), (b"7", 7), (b"[]", []),
                                         (b'{"code": "print(1)", "files": {"a": "b"}}',
                                          {"code": "print(1)", "files": {"a": "b"}})])
def test_shallow_bodies_parse_as_json_loads_does(raw: bytes, parsed: object) -> None:
    assert load_json(raw) == parsed


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\xfa", b"", b'{"x": ' + b"9" * 5000 + b"}"])
def test_what_is_not_json_says_so(raw: bytes) -> None:
    with pytest.raises(JsonBodyError, match="request body is not valid JSON: "):
        load_json(raw)


@pytest.mark.parametrize("requested, open_files, cap", [
    (None, 1024, 768),  # a login shell's usual soft limit: 256 kept for everything else
    (None, 20_000, 15_000),  # a quarter kept
    (None, 200, 100),  # a tiny limit: half kept
    (100, 1024, 100),
    (5000, 1024, 768),  # more than fits: lowered
])
def test_the_connection_cap_stays_below_the_open_files_limit(requested: int | None, open_files: int,
                                                             cap: int) -> None:
    assert connection_cap(requested, open_files) == cap
