"""The owner rule every control plane follows (verl_sf.tenancy)."""

from __future__ import annotations

import hmac

import pytest

from verl_sf import tenancy
from verl_sf.tenancy import key_accepted, key_matches, new_token, owner_of, owns, token_matches


def test_a_sandbox_is_its_creating_key_s_only() -> None:
    owner = owner_of("key-a")
    assert owns(owner, "key-a")
    assert not owns(owner, "key-b") and not owns(owner, "key-a ") and not owns(owner, "KEY-A")
    assert not owns(owner, "")
    assert not owns(None, "key-a") and not owns(None, "")  # no sandbox, or one no key owns
    assert owner_of("key-a") == owner and len(owner) == 32
    assert b"key-a" not in owner  # the key itself is not kept
    assert owns(owner_of("\udcff\u00e9"), "\udcff\u00e9")  # any str a header decodes to


def test_the_server_key_is_the_only_tenant_when_set() -> None:
    assert key_accepted(None, "anything") and key_accepted(None, "another")
    assert not key_accepted(None, "") and not key_accepted(None, None)
    assert key_accepted("server-key", "server-key")
    assert not key_accepted("server-key", "server-key2") and not key_accepted("server-key", "server-ke")
    assert not key_accepted("server-key", "") and not key_accepted("", "")
    assert key_matches("a", "a") and not key_matches("a", "b")


def test_tokens_match_only_themselves() -> None:
    token = new_token()
    assert len(token) == 32 and new_token() != token
    assert token_matches(token, token)
    assert not token_matches(token, token + "x") and not token_matches(token, token[:-1])
    assert not token_matches(token, None) and not token_matches(token, "")
    assert not token_matches(None, token) and not token_matches(None, "") and not token_matches(None, None)
    assert not token_matches("", "") and not token_matches("", None)  # an empty token never opens anything


@pytest.mark.parametrize("check", [
    lambda: owns(owner_of("key-a"), "key-a"),
    lambda: owns(owner_of("key-a"), "key-b"),
    lambda: owns(None, "key-a"),
    lambda: token_matches("t" * 32, "t" * 32),
    lambda: token_matches(None, "t" * 32),
    lambda: token_matches("t" * 32, None),
])
def test_every_check_is_one_constant_time_comparison_of_digests(monkeypatch: pytest.MonkeyPatch, check) -> None:
    """A missing owner or token is compared like a present one, so the work does not tell ids apart."""
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(tenancy.hmac, "compare_digest", compare_digest)
    check()
    assert compared == [(32, 32)]


def test_a_key_or_token_that_is_not_printable_ascii_is_refused() -> None:
    """Header bytes that are not UTF-8 arrive as lone surrogates; a relay could not pass them on as they
    came, and two keys would become one tenant on the server holding the sandbox."""
    for odd in ("zz\udce9", "k\u00e9y", "tab\tkey", "\u20ac"):
        assert not key_accepted(None, odd)
        assert not token_matches(odd, odd)
    assert key_accepted(None, "e2b_0123abcd") and token_matches("t0k-en_", "t0k-en_")
