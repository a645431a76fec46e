"""A large body decoded a piece at a time (json_pieces.py) is what `json.loads` makes of it, however
clients write it and wherever the pieces are cut; past the caps it is refused before it is parsed."""

from __future__ import annotations

import codecs
import json
import random
import re

import pytest

from verl_sf import json_body, json_pieces
from verl_sf.json_body import JsonBodyError, load_json

# Characters whose JSON escapes differ in length: a cut anywhere between them must not change the output.
ALPHABET = ["a", '"', "\\", "\n", "\t", "\x00", "\x7f", "é", "😀", "\ud800", "\udfff", "\u2028", "/"]


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(size))


def _decoded(raw: bytes) -> object:
    return json_pieces.decode(raw, 10 ** 9, 10 ** 9)


def _document(rng: random.Random) -> object:
    """Objects, lists, repeated keys' worth of short and long strings (escaped or not), numbers, literals."""
    def value(depth: int) -> object:
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind <= 1:
            return _text(rng, rng.choice([0, 1, 3, 8, 30, 200]))
        if kind == 2:
            return rng.choice([0, -1.5, 10 ** 20, True, False, None, 3e-7])
        if kind == 3:
            return _text(rng, 2)
        if kind == 4:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {_text(rng, rng.choice([1, 2, 12])): value(depth + 1) for _ in range(rng.randrange(4))}
    return {"code": _text(rng, rng.randint(0, 300)), "runs": "\\" * rng.randint(0, 99) + "😀" * rng.randint(0, 40),
            "more": value(0)}


def _raw_forms(document: object, rng: random.Random) -> list[bytes]:
    """The same document as clients write it: escaped or raw UTF-8 (after a byte order mark or not), UTF-16
    or UTF-32, compact or indented, escapes in either case and `\\/`, a repeated key."""
    ascii_form = json.dumps(document).encode()
    text = json.dumps(document, ensure_ascii=False)
    forms = [ascii_form, text.encode("utf-8", "surrogatepass"), codecs.BOM_UTF8 + ascii_form,
             text.encode(rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"]), "surrogatepass"),
             json.dumps(document, indent=rng.choice([1, 3]), separators=(" , ", " :  ")).encode(),
             re.sub(rb"\\u([0-9a-f]{4})", lambda m: b"\\u" + m.group(1).upper(), ascii_form).replace(b"/", b"\\/"),
             b'{"k": 1, "k": "' + b"\\u00e9" * 5 + b'", "' + b"\\u00e9" * 5 + b'": 2, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9": 3'
             + b', "k": ' + ascii_form + b"}"]
    return forms


def test_a_body_decoded_in_pieces_is_what_json_loads_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_pieces, "LONG_STRING", 4)
    rng = random.Random(11)
    for piece in (1, 2, 5, 7, 16, 33):
        monkeypatch.setattr(json_pieces, "PIECE_CHARS", piece)
        for _ in range(150):
            for raw in _raw_forms(_document(rng), rng):
                assert _decoded(raw) == json.loads(raw), raw


@pytest.mark.parametrize("raw", [b'{"a": "' + b"x" * 40, b'{"a": "xxxxxxxxxx\\q"}', b'{"a": "xxxxxxxxxx\\u12"}',
                                 b'{"a": "xxxxxxxxxx\x01"}', b'{"a": "xxxxxxxxxx\xff"}', b'{"a": "xxxxxxxxxx\\',
                                 b'{"a": "xxxxxxxxxx" "b"}', b'{"a": 1,}', b'[1 2]', b'{"a": "xxxxxxxxxxxx"', b"",
                                 b'["xxxxxxxxxxxx"]x', b'"xxxxxxxxxx\\ud83d\\u"'])
def test_a_body_that_is_not_json_is_refused_in_pieces_as_at_once(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_pieces, "LONG_STRING", 4)
    monkeypatch.setattr(json_pieces, "PIECE_CHARS", 5)
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(ValueError):
        _decoded(raw)


def test_an_error_in_a_piece_names_its_place_in_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_pieces, "PIECE_CHARS", 40)
    for fault, error in ((b"\\q", r"Invalid \\escape at byte 110"), (b"\x01", "Invalid control character at byte 110"),
                         (b"\xff", r"not UTF-8 \(invalid start byte\) at byte 110")):
        with pytest.raises(ValueError, match=error):
            _decoded(b'{"code": "' + b"x" * 100 + fault + b'"}')


def _refusal(raw: bytes | str) -> str:
    with pytest.raises(JsonBodyError) as refused:
        load_json(raw)
    return str(refused.value)


def test_a_large_body_is_refused_past_the_caps_before_it_is_parsed() -> None:
    padding = '"' + "p" * (1 << 20) + '"'
    assert load_json(f'{{"pad": {padding}, "x": [{", ".join(["1"] * 49_000)}]}}'.encode())["x"][-1] == 1
    commas = f'{{"pad": {padding}, "x": [{", ".join(["1"] * 100_001)}]}}'.encode()
    assert "more than 100,000 JSON tokens" in _refusal(commas)
    deep = f'{{"pad": {padding}, "x": {"[" * 101 + "]" * 101}, "y": [{", ".join(["1"] * 100_001)}]}}'.encode()
    assert "deeper than 100 levels" in _refusal(deep)
    digits = f'{{"pad": {padding}, "x": [{", ".join(["7" * 4300] * 300)}]}}'.encode()
    assert "more than 1,048,576 bytes outside its strings" in _refusal(digits)
    in_strings = f'{{"pad": {padding}, "x": "{", ".join(["1"] * 200_000)}"}}'.encode()  # a CSV: one string
    assert load_json(in_strings)["x"].count(",") == 199_999


def test_the_caps_count_as_a_small_body_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings, `,`, `:` and opening brackets outside strings (not the strings' own): the same verdict at
    either size."""
    monkeypatch.setattr(json_body, "MAX_JSON_TOKENS", 20)
    verdicts = []
    for entries in range(1, 6):  # 7 tokens an entry
        body = "{" + ", ".join(f'"k{n}": [{{}}, "a,b:[{{"]' for n in range(entries)) + "}"
        small, large = body.encode(), body.encode() + b" " * (1 << 20)
        verdict = load_json(small) if 7 * entries <= 20 else _refusal(small)
        assert (load_json(large) if 7 * entries <= 20 else _refusal(large)) == verdict
        verdicts.append(isinstance(verdict, dict))
    assert verdicts == [True, True, False, False, False]


def test_a_large_text_body_is_read_as_its_utf8_would_be() -> None:
    """A WebSocket's text message (Daytona's interpreter) is parsed a piece at a time, as its bytes are."""
    document = {"code": "é😀\ud800\\\"" * (1 << 18), "k": [1, 2.5, None]}
    text = json.dumps(document, ensure_ascii=False)
    assert load_json(text) == document == load_json(text.encode("utf-8", "surrogatepass"))
    assert "BOM" in _refusal("\ufeff" + text)
