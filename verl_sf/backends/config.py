"""Backend settings: the union of the per-backend configs, told apart by their `type` tag.

Each backend module holds its config next to its backend (`HttpBackendConfig` in `http.py`, ...):
a frozen pydantic model whose `build()` makes that backend.  This module is their union, as a
tool yaml's `backend:` key (`http`, `local`, `daytona`, `cluster`) chooses among them, and the
one place a new backend is added to it.
"""

from __future__ import annotations

from typing import Annotated, Any, Union, get_args

from pydantic import Field, TypeAdapter

from verl_sf.backends.base import BackendConfigBase
from verl_sf.backends.cluster import ClusterBackendConfig
from verl_sf.backends.daytona import DaytonaBackendConfig
from verl_sf.backends.http import HttpBackendConfig
from verl_sf.backends.local import LocalBackendConfig

BackendConfig = Annotated[
    Union[HttpBackendConfig, LocalBackendConfig, DaytonaBackendConfig, ClusterBackendConfig],
    Field(discriminator="type"),
]
"""Any backend's config; pydantic picks the class by `type` and names bad fields under it."""

BACKEND_CONFIGS: dict[str, type[BackendConfigBase]] = {
    config.model_fields["type"].default: config for config in get_args(get_args(BackendConfig)[0])
}
"""The config class of each `type` tag, in the union's order."""

_PARSER: TypeAdapter[BackendConfig] = TypeAdapter(BackendConfig)


def parse_backend_config(data: Any) -> BackendConfig:
    """The config `data` (a mapping with a `type` tag) describes; pydantic's ValidationError names bad fields."""
    return _PARSER.validate_python(data)


__all__ = ["BACKEND_CONFIGS", "BackendConfig", "ClusterBackendConfig", "DaytonaBackendConfig", "HttpBackendConfig",
           "LocalBackendConfig", "parse_backend_config"]
