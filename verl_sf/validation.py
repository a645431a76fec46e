"""A request body's validation failure in one line, for the APIs whose errors are a message."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, StrictStr, ValidationError

ENVIRONMENT_MAX_NAMES = 4096
ENVIRONMENT_MAX_BYTES = 1 << 20  # names and values together; Linux's limit for exec is ~2 MiB of arguments too
METADATA_MAX_BYTES = 64 << 10


def first_error(exc: ValidationError) -> str:
    """The first problem of a validation as `field: message` (`body` when it is the whole body)."""
    first = exc.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc']) or 'body'}: {first['msg']}"


def _environment(values: dict[str, str]) -> dict[str, str]:
    """Environment variables a process can be given: names without `=` or NUL, values without NUL."""
    if len(values) > ENVIRONMENT_MAX_NAMES:
        raise ValueError(f"{len(values)} variables, more than {ENVIRONMENT_MAX_NAMES}")
    size = 0
    for name, value in values.items():
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"{name[:64]!r} is not a variable name (empty, or holding '=' or a NUL byte)")
        if "\0" in value:
            raise ValueError(f"the value of {name[:64]!r} holds a NUL byte")
        size += len(name.encode()) + len(value.encode()) + 2
    if size > ENVIRONMENT_MAX_BYTES:
        raise ValueError(f"the variables take {size} bytes, more than {ENVIRONMENT_MAX_BYTES}")
    return values


def _metadata(values: dict[str, str]) -> dict[str, str]:
    size = sum(len(name.encode()) + len(value.encode()) for name, value in values.items())
    if size > METADATA_MAX_BYTES:
        raise ValueError(f"it takes {size} bytes, more than {METADATA_MAX_BYTES}")
    return values


Environment = Annotated[dict[StrictStr, StrictStr], AfterValidator(_environment)]
"""A map of environment variables from a client (E2B's `envs`, Daytona's `env`)."""
Metadata = Annotated[dict[StrictStr, StrictStr], AfterValidator(_metadata)]
"""A sandbox's metadata or labels from a client: kept by the server and listed, so its size is capped."""
