"""A request body's validation failure in one line, for the APIs whose errors are a message."""

from __future__ import annotations

from pydantic import ValidationError


def first_error(exc: ValidationError) -> str:
    """The first problem of a validation as `field: message` (`body` when it is the whole body)."""
    first = exc.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc']) or 'body'}: {first['msg']}"
