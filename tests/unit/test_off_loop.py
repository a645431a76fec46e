"""Work on long strings done a piece at a time (so that, in a thread, the event loop gets its turns)
gives exactly what the one-call version gives, whatever the cuts fall on."""

from __future__ import annotations

import base64
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
                    "flag": True, "none": None, _text(rng, 4): "key with escapes",
                    "deep": {"args": [_text(rng, 30), {"x": [_text(rng, 20)], 1: "int key"}], "e": {}, "l": []}}
        assert off_loop.json_bytes(document) == json.dumps(document).encode()


def test_a_small_document_is_encoded_at_once() -> None:
    document = {"code": "print(1)", "files": {}}
    assert off_loop.json_bytes(document) == json.dumps(document).encode()


def test_base64_in_pieces_is_the_whole_ones(small_pieces: None) -> None:
    rng = random.Random(8)
    for size in (0, 1, 2, 3, 20, 21, 22, 23, 100):
        data = rng.randbytes(size)
        assert off_loop.base64_of(data) == base64.b64encode(data).decode()
        assert off_loop.bytes_of(base64.b64encode(data).decode()) == data


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
