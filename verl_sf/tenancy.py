"""Who may reach a sandbox, the one rule of every control plane (E2B's, Daytona's).

A sandbox belongs to the API key that created it, as E2B scopes sandboxes to a team: the control
plane keeps a digest of that key (never the key), and a request whose key does not own a sandbox
is answered exactly as for a sandbox that does not exist.  A server started with a key of its own
accepts only that key (one tenant); otherwise every distinct non-empty key is a tenant of its own.
Calls into a sandbox (its data plane) carry a token of that sandbox instead of the key.

Every check compares fixed-length digests with `hmac.compare_digest`, and a missing owner or
token is compared against a dummy, so neither the answer nor the work done tells a caller whether
an id it does not own exists.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import NewType, Optional

Owner = NewType("Owner", bytes)
"""A key's digest: what a control plane stores as a sandbox's owner."""

_NOBODY = bytes(32)
"""Compared in place of a missing owner or token: no key or token hashes to it."""


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def owner_of(api_key: str) -> Owner:
    return Owner(_digest(api_key))


def owns(owner: Optional[Owner], api_key: str) -> bool:
    """Whether `api_key` owns a sandbox owned by `owner` (None: no sandbox, or one no key owns)."""
    same = hmac.compare_digest(owner if owner is not None else _NOBODY, _digest(api_key))
    return same and owner is not None


def key_matches(expected: str, given: str) -> bool:
    """A server-wide key check in constant time."""
    return hmac.compare_digest(_digest(expected), _digest(given))


def well_formed(key: str) -> bool:
    """Whether a key is printable ASCII, as every SDK's keys are.  Other bytes are refused, not read: a
    header's bytes that are not UTF-8 reach the server as lone surrogates, which a relay to another
    server of a fleet cannot pass on as they came, and two keys must never become one tenant."""
    return key.isascii() and key.isprintable()


def key_accepted(required: Optional[str], given: Optional[str]) -> bool:
    """Whether a control plane takes `given` at all: non-empty printable ASCII, and the server's key if it has one."""
    if not given or not well_formed(given):
        return False
    return required is None or key_matches(required, given)


def new_token() -> str:
    """A sandbox's data-plane token (192 random bits), handed only to its owner."""
    return secrets.token_urlsafe(24)


def token_matches(expected: Optional[str], given: Optional[str]) -> bool:
    """Whether `given` is the token `expected` (None: no sandbox by that id); a missing or empty one never is."""
    same = hmac.compare_digest(_digest(expected) if expected is not None else _NOBODY, _digest(given or ""))
    return same and expected is not None and bool(given) and well_formed(given or "")
