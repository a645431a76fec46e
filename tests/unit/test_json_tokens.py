"""The token cap on request bodies counts strings, separators and opening brackets outside strings,
exactly at its edge, whatever the strings hold; brackets alone, one inside another, are the depth
limit's."""

from __future__ import annotations

import json

import pytest

from verl_sf.json_body import MAX_JSON_DEPTH, MAX_JSON_TOKENS, JsonBodyError, load_json


def strings(count: int) -> str:
    """A body of exactly 2 * count + 3 tokens: '{', "a", ':', '[', then count strings and count - 1 commas."""
    return json.dumps({"a": ["x"] * count})


@pytest.mark.parametrize("as_bytes", [False, True])
def test_the_cap_is_exact(as_bytes: bool) -> None:
    at_cap, past_cap = strings((MAX_JSON_TOKENS - 3) // 2), strings((MAX_JSON_TOKENS - 3) // 2 + 1)
    assert load_json(at_cap.encode() if as_bytes else at_cap)["a"][0] == "x"
    with pytest.raises(JsonBodyError, match=f"more than {MAX_JSON_TOKENS:,} JSON tokens"):
        load_json(past_cap.encode() if as_bytes else past_cap)


def test_separators_inside_strings_are_not_tokens() -> None:
    # Each string holds commas, colons, brackets and escaped quotes and backslashes: one token each.
    inner = ',:[{\\"\\\\' * 50
    body = "[" + ",".join(f'"{inner}"' for _ in range(MAX_JSON_TOKENS // 2)) + "]"  # '[', then strings and commas
    assert len(load_json(body)) == MAX_JSON_TOKENS // 2


def test_brackets_alone_are_the_depth_limits_not_the_token_caps() -> None:
    for body in (b"[" * (MAX_JSON_TOKENS * 2), "[ \n" * (MAX_JSON_TOKENS * 2),
                 b'{"code": "[[[", "a": ' + b"{[" * MAX_JSON_TOKENS):  # spaced, or after fields and strings
        with pytest.raises(JsonBodyError, match=f"deeper than {MAX_JSON_DEPTH} levels"):
            load_json(body)


def test_many_lists_each_nested_within_the_limit_are_past_the_token_cap() -> None:
    """99,000 lists each 99 deep (18 MiB, ten million lists) parsed for 8.5 s and took a GB; now they are
    refused at the cap's first 100,001 tokens, most of them brackets."""
    body = "[" + ",".join(["[" * 99 + "]" * 99] * 99_000) + "]"
    with pytest.raises(JsonBodyError, match=f"more than {MAX_JSON_TOKENS:,} JSON tokens"):
        load_json(body)
    deep_text = "[" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(JsonBodyError, match=f"more than {MAX_JSON_TOKENS:,} JSON tokens"):
        load_json(json.dumps([deep_text] * (MAX_JSON_TOKENS // 2 + 1)))  # a string's brackets make no run
    assert load_json(json.dumps([deep_text] * 1000))[0] == deep_text


def test_a_long_string_is_one_token() -> None:
    body = json.dumps({"code": "a, b: [c]" * 200_000, "stdin": "\n\t\"" * 100_000})
    assert len(load_json(body)["code"]) == 9 * 200_000
