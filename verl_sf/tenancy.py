"""Who owns a sandbox: a digest of the API key that created it, compared in constant time.

A control plane keeps the digest, never the key; a request whose key does not own a sandbox is
answered as for a sandbox that does not exist, so keys learn nothing of each other's sandboxes.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import NewType

Owner = NewType("Owner", bytes)


def owner_of(api_key: str) -> Owner:
    return Owner(hashlib.sha256(api_key.encode("utf-8", "surrogateescape")).digest())


def owns(owner: Owner, api_key: str) -> bool:
    return hmac.compare_digest(owner, owner_of(api_key))


def key_matches(expected: str, given: str) -> bool:
    """A server-wide key check in constant time."""
    return hmac.compare_digest(expected.encode("utf-8", "surrogateescape"), given.encode("utf-8", "surrogateescape"))
