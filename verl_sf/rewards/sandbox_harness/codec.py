"""The harness's wire: plain data as JSON (`encode`, `decode`), and one JSON line written to a descriptor."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

_SCALARS = (type(None), bool, int, float, str)
_SEQUENCE_TYPES: dict[str, Callable[[Any], Any]] = {"tuple": tuple, "set": set, "frozenset": frozenset}


class NotPlainData(ValueError):
    """A value that is not made of exact builtin None, bool, int, float, str, bytes, list, tuple, set, frozenset
    and dict: a subclass of one of them is not plain either (its `__eq__` could say anything)."""


def encode(value: Any) -> Any:
    """`value` as JSON-ready data; lists stay arrays, other containers and bytes become one-key tagged objects.

    Types are told apart by identity only: a metaclass can make a class compare or hash equal to `int`."""
    kind = type(value)
    if kind is int or kind is str or kind is float or kind is bool or value is None:
        return value
    if kind is list:
        return [encode(item) for item in value]
    if kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [encode(item) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key), encode(item)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise NotPlainData(_type_name(kind))


def decode(data: Any) -> Any:
    """The value `encode` gave `data` for; anything else `encode` cannot produce raises NotPlainData."""
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is list:
        return [decode(item) for item in data]
    if kind is dict and len(data) == 1:
        ((tag, payload),) = data.items()
        try:
            if tag in _SEQUENCE_TYPES and type(payload) is list:
                return _SEQUENCE_TYPES[tag](decode(item) for item in payload)
            if tag == "dict" and type(payload) is list and all(type(p) is list and len(p) == 2 for p in payload):
                return {decode(key): decode(item) for key, item in payload}
            if tag == "bytes" and type(payload) is str:
                return bytes.fromhex(payload)
        except (TypeError, ValueError):  # an unhashable key or member, bad hex
            pass
    raise NotPlainData(f"not an encoded value: {str(data)[:80]}")


def _type_name(kind: type) -> str:
    """The class's name without running any of its code (a metaclass may define `__repr__`)."""
    name = type.__dict__["__qualname__"].__get__(kind)
    return name[:80] if type(name) is str else "?"


def _emit(fd: int, message: dict) -> None:
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(fd, data):]
