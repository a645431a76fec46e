"""Ownership by API key: a digest is kept, never the key; only the same key owns."""

from __future__ import annotations

from verl_sf.tenancy import key_matches, owner_of, owns


def test_the_key_that_made_a_sandbox_owns_it_and_no_other_does() -> None:
    owner = owner_of("key-a")
    assert owns(owner, "key-a")
    assert not owns(owner, "key-b") and not owns(owner, "key-a ") and not owns(owner, "")
    assert b"key-a" not in owner and len(owner) == 32


def test_odd_keys_are_owners_too() -> None:
    for key in ("ünïcode", "\udcff-surrogate", "x" * 10_000):
        assert owns(owner_of(key), key) and not owns(owner_of(key), key[:-1])


def test_server_key_check() -> None:
    assert key_matches("secret", "secret")
    assert not key_matches("secret", "secret2") and not key_matches("secret", "")
