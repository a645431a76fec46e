"""Work on long strings done a piece at a time (so that, in a thread, the event loop gets its turns)
gives exactly what the one-call version gives, whatever the cuts fall on."""

from __future__ import annotations

import base64
import codecs
import json
import random
import re

import pytest

from verl_sf import models, off_loop
from verl_sf.executor import pool
from verl_sf.executor.pool import names_in

# Characters whose JSON escapes differ in length: a cut anywhere between them must not change the output.
ALPHABET = ["a", '"', "\\", "\n", "\t", "\x00", "\x7f", "é", "😀", "\ud800", "\udfff", "\u2028", "/"]


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(off_loop, "PIECE_CHARS", 7)
    monkeypatch.setattr(off_loop, "OFF_LOOP_BYTES", 0)


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(size))


def test_json_in_pieces_is_byte_for_byte_json_dumps(small_pieces: None) -> None:
    rng = random.Random(7)
    for _ in range(300):
        document = {"code": _text(rng, rng.randint(0, 40)), "stdin": _text(rng, rng.randint(0, 30)), "n": 3,
                    "files": {"a.txt": _text(rng, 20), "b": None, "c": 1.5}, "fetch_files": [_text(rng, 9), "x"],
                    "flag": True, "none": None, _text(rng, 4): "key with escapes"}
        assert off_loop.json_bytes(document) == json.dumps(document).encode()


def test_a_small_document_is_encoded_at_once() -> None:
    document = {"code": "print(1)", "files": {}}
    assert off_loop.json_bytes(document) == json.dumps(document).encode()


def test_base64_in_pieces_is_the_whole_ones(small_pieces: None) -> None:
    rng = random.Random(8)
    for size in (0, 1, 2, 3, 20, 21, 22, 23, 100):
        data = rng.randbytes(size)
        assert off_loop.base64_of(data) == base64.b64encode(data).decode()


def test_names_are_found_across_pieces_and_only_as_whole_words(monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = ["numpy", "sympy"]
    for piece in (1, 2, 3, 5, 7, 11):
        monkeypatch.setattr(pool, "PIECE_CHARS", piece)
        assert names_in(pattern, "x = 1\nimport numpy\n") == {"numpy"}
        assert names_in(pattern, "import numpyx, xsympy, sympy_\n") == set()
        assert names_in(pattern, "numpy") == {"numpy"}
        assert names_in(pattern, "a.sympy+numpy;") == {"numpy", "sympy"}
        assert names_in(pattern, "numpy numpy numpyx sympy") == {"numpy", "sympy"}
        assert names_in(pattern, "") == set()


def test_a_name_said_a_million_times_costs_a_search_per_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = pool._words

    def counted(names: list[str]) -> re.Pattern[str]:
        nonlocal calls
        calls += 1
        return real(names)

    code = "import numpy; " * 200_000  # 2.8 MB: three pieces
    monkeypatch.setattr(pool, "_words", counted)
    assert names_in(["numpy", "sympy"], code) == {"numpy"}
    assert calls <= 2 * 3, calls  # per piece: the search that finds numpy, then one for sympy alone


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
    monkeypatch.setattr(off_loop, "LONG_STRING", 4)
    rng = random.Random(11)
    for piece in (1, 2, 5, 7, 16, 33):
        monkeypatch.setattr(off_loop, "PIECE_CHARS", piece)
        for _ in range(150):
            for raw in _raw_forms(_document(rng), rng):
                assert off_loop.json_value(raw) == json.loads(raw), raw


@pytest.mark.parametrize("raw", [b'{"a": "' + b"x" * 40, b'{"a": "xxxxxxxxxx\\q"}', b'{"a": "xxxxxxxxxx\\u12"}',
                                 b'{"a": "xxxxxxxxxx\x01"}', b'{"a": "xxxxxxxxxx\xff"}', b'{"a": "xxxxxxxxxx\\',
                                 b'{"a": "xxxxxxxxxx" "b"}', b'{"a": 1,}', b'[1 2]', b'{"a": "xxxxxxxxxxxx"', b"",
                                 b'["xxxxxxxxxxxx"]x', b'"xxxxxxxxxx\\ud83d\\u"'])
def test_a_body_that_is_not_json_is_refused_in_pieces_as_at_once(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(off_loop, "LONG_STRING", 4)
    monkeypatch.setattr(off_loop, "PIECE_CHARS", 5)
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(ValueError):
        off_loop.json_value(raw)


def test_a_string_in_pieces_names_where_it_starts() -> None:
    raw = b'{"code": "' + b"x" * 100 + b'\\q"}'
    with pytest.raises(ValueError, match=r"Invalid \\escape in the string starting at byte 9"):
        off_loop.json_value(raw)


def test_files_base64_checked_in_pieces_as_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def at_once(content: str) -> bool:
        try:
            base64.b64decode("".join(content.split()), validate=True)
        except ValueError:  # binascii.Error, and non-ASCII text
            return False
        return True

    def in_pieces(content: str) -> bool:
        try:
            models._check_base64(content)
        except ValueError:
            return False
        return True

    rng = random.Random(9)
    for piece in (1, 2, 3, 5):
        monkeypatch.setattr(models, "PIECE_CHARS", piece)
        for _ in range(3000):
            if rng.random() < 0.5:
                content = "".join(rng.choice("AAAAbcd+/==\n \t\x1fé") for _ in range(rng.randrange(40)))
            else:
                content = base64.b64encode(rng.randbytes(rng.randrange(40))).decode()
                cut = rng.randrange(len(content) + 1)
                content = content[:cut] + rng.choice(["", "\n", "\r\n ", "="]) + content[cut:]
            assert in_pieces(content) == at_once(content), repr(content)


def test_a_lone_surrogate_is_found_in_any_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "PIECE_CHARS", 3)
    assert models.check_text(["ascii only", "é" * 10]) == ["ascii only", "é" * 10]
    for at in range(10):
        text = "é" * at + "\udc80" + "é" * (9 - at)
        with pytest.raises(ValueError, match=f"U\\+DC80\\) at position {at}$"):
            models.check_text(text)
