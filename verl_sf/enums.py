"""`StrEnum`: a `str, Enum` whose members print as their value, on every supported Python."""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    """Members are their values everywhere text is made (f-strings, str(), json, logs), as
    Python 3.11's `enum.StrEnum` does; plain `str, Enum` prints `Class.member` there since 3.11."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)
