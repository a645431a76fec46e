"""Backend settings: one tagged, frozen pydantic model per backend, validated once.

A config is plain, hashable data: the tool hands it to whichever process runs the call (its
own, or a Ray pool actor), and that process keeps one backend per config (`build()` once).
The `type` field is the tag (`http`, `local`, `daytona`, `cluster`), as in a tool yaml's `backend:` key.

Adding a backend is its module (a `SandboxBackend` subclass whose `__init__` takes the config)
plus one config class in this module (so its name is known before the backend is imported)::

    class ClusterBackendConfig(BackendConfig):
        type: Literal["cluster"] = "cluster"
        spill_at: Optional[int] = Field(None, ge=1)   # its options, range-checked by pydantic

        def backend_class(self) -> BackendClass:
            from verl_sf.backends.cluster import ClusterSandboxBackend
            return ClusterSandboxBackend

Defining the subclass registers it: `parse_backend_config({"type": "cluster", ...})`, fields typed
`AnyBackendConfig` and the tool's `backend: cluster` (options from the yaml's `cluster:` block) all
know it; nothing else changes.  Override `build()` for a backend that takes keyword options instead of its
config.  Whether a backend keeps sessions is its class's `supports_sessions` flag, read through
here, so the tool decides without building one.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Optional, TypeAlias

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, TypeAdapter, field_validator

from verl_sf.executor import ExecutorConfig
from verl_sf.executor.config import CONFIG_ALIASES

if TYPE_CHECKING:
    from verl_sf.backends.base import SandboxBackend

# Spelled out here: inside the config classes `type` is the tag field, not the builtin.
BackendClass: TypeAlias = "type[SandboxBackend]"
ConfigClass: TypeAlias = "type[BackendConfig]"


class BackendConfig(BaseModel):
    """Base of the per-backend configs; subclasses register themselves under their `type`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registry: ClassVar[dict[str, ConfigClass]] = {}
    tool_block_field: ClassVar[Optional[str]] = None
    """The field the tool yaml's `<type>:` block fills; None: the block holds this config's own fields."""
    default_session: ClassVar[str] = "none"
    """The verl tool's `session` when its yaml sets none: `none` (stateless) or `trajectory`."""

    type: str

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        BackendConfig.registry[cls.model_fields["type"].default] = cls

    def __hash__(self) -> int:  # fields may hold dicts or dataclasses: hash the canonical JSON instead
        return hash((type(self), self.model_dump_json()))

    def backend_class(self) -> BackendClass:
        """The backend this config builds (imported lazily: a config is cheap to load and pickle)."""
        raise NotImplementedError

    def build(self) -> SandboxBackend:
        """A new backend; it connects and starts nothing until its first call."""
        return self.backend_class()(self)  # type: ignore[call-arg]  # each backend's __init__ takes its config

    @property
    def supports_sessions(self) -> bool:
        return self.backend_class().supports_sessions

    def probe_sessions(self) -> bool:
        """Blocking, for construction time: True when sessions are known to work, False when that cannot be
        told yet (ask the backend's `check_sessions()` later); raises `SessionsUnsupported` when they cannot."""
        return self.supports_sessions

    @classmethod
    def from_tool_block(cls, block: dict[str, Any], *, sandbox_fusion_url: Optional[str]) -> dict[str, Any]:
        """The raw config a tool yaml's flat keys and `<type>:` block describe (validated by the caller)."""
        name = cls.model_fields["type"].default
        return {"type": name, **(block if cls.tool_block_field is None else {cls.tool_block_field: block})}


def normalize_base_url(url: str) -> str:
    """`http://host:port`, `.../run_code` (verl's `sandbox_fusion_url`) or `.../run_jupyter`
    -> the base URL the endpoints hang off.  Raises ValueError for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"sandbox URL must be a non-empty string, got {url!r}")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"sandbox URL must look like http(s)://host[:port][/run_code], got {url!r}")
    path = parts.path.rstrip("/")
    for endpoint in ("/run_code", "/run_jupyter"):
        if path.endswith(endpoint):
            path = path[: -len(endpoint)]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class HttpBackendConfig(BackendConfig):
    """`backend: http`: any Sandbox Fusion compatible server; the yaml's `http:` block sets the retry policy."""

    type: Literal["http"] = "http"
    url: str
    """Base URL; verl's `sandbox_fusion_url` (ending in /run_code) is accepted and trimmed."""
    max_retries: int = Field(5, ge=0)
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    max_retry_after_s: float = Field(60.0, ge=0)
    """A Retry-After longer than this is not waited for: the call fails at once."""
    connect_timeout_s: float = Field(10.0, ge=0)
    server_margin_s: float = Field(60.0, ge=0)
    """Time the server may spend beyond the request's own time-outs (queueing, sandbox start)."""
    connection_limit: int = Field(256, ge=1)

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return normalize_base_url(value)

    def backend_class(self) -> BackendClass:
        from verl_sf.backends.http import HttpSandboxBackend

        return HttpSandboxBackend

    def probe_sessions(self) -> bool:
        """Asks the server (POST /sessions, creating nothing): a plain Sandbox Fusion server has no sessions."""
        from verl_sf.backends.http import probe_sessions

        return probe_sessions(self.url, self.connect_timeout_s)

    @classmethod
    def from_tool_block(cls, block: dict[str, Any], *, sandbox_fusion_url: Optional[str]) -> dict[str, Any]:
        if not sandbox_fusion_url:
            raise ValueError("sandbox_fusion_url is required for the http backend "
                             "(or set backend: local / backend: daytona)")
        return {**super().from_tool_block(block, sandbox_fusion_url=None), "url": sandbox_fusion_url}


class LocalBackendConfig(BackendConfig):
    """`backend: local`: the executor inside the calling process; the yaml's `local:` block is its settings."""

    type: Literal["local"] = "local"
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    tool_block_field: ClassVar[Optional[str]] = "executor"

    @field_validator("executor", mode="before")
    @classmethod
    def _earlier_names(cls, value: object) -> object:
        """`workers` and `max_queue` are the earlier names of `slots` and `max_in_flight`."""
        if isinstance(value, dict):
            return {CONFIG_ALIASES.get(key, key): item for key, item in value.items()}
        return value

    def backend_class(self) -> BackendClass:
        from verl_sf.backends.local import LocalSandboxBackend

        return LocalSandboxBackend


class DaytonaBackendConfig(BackendConfig):
    """`backend: daytona`: the yaml's `daytona:` block.  Credentials come from the SDK's own environment
    variables (DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET), never from the yaml."""

    type: Literal["daytona"] = "daytona"
    default_session: ClassVar[str] = "trajectory"
    snapshot: Optional[str] = None
    """Snapshot to create sandboxes from (the SDK's default python snapshot when unset)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels; the verl-sf labels the reaper selects on are always added."""
    auto_stop_interval: int = Field(15, ge=0)
    """Minutes of inactivity before Daytona stops a sandbox: the backstop for leaked ones."""
    auto_delete_interval: int = Field(0, ge=-1)
    """Minutes after stopping before Daytona deletes it (0: at once, -1: never)."""
    create_timeout: float = Field(60, gt=0)

    def backend_class(self) -> BackendClass:
        from verl_sf.backends.daytona import DaytonaSandboxBackend

        return DaytonaSandboxBackend


class ClusterBackendConfig(BackendConfig):
    """`backend: cluster`: the fleet of `verl-sf cluster up`, found through Ray; the yaml's `cluster:` block."""

    type: Literal["cluster"] = "cluster"
    address: Optional[str] = None
    """Ray cluster to join when this process is not connected yet (default: RAY_ADDRESS, else auto)."""
    namespace: str = "verl-sf-cluster"
    """Ray namespace of the fleet (`verl-sf cluster up --namespace`)."""
    refresh_s: float = Field(10.0, ge=0)
    """How often the server list is re-read from Ray (sooner after a server fails)."""
    spill_at: Optional[int] = Field(None, ge=1)
    """This process's calls in flight on its node's server at which further calls go elsewhere
    (default: that server's slot count)."""
    busy_s: float = Field(0.5, ge=0)
    """How long a server that answered 503/429 is passed over."""
    max_rounds: int = Field(5, ge=1)
    """Passes over the servers before a call gives up (jittered backoff in between)."""
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    http: dict[str, Any] = Field(default_factory=dict)
    """HttpBackendConfig options for the calls (connect_timeout_s, server_margin_s, connection_limit)."""

    @field_validator("http")
    @classmethod
    def _http_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "max_retries" in value or "url" in value:
            raise ValueError("url and max_retries do not apply: the fleet's servers are found through Ray, and a "
                             "call a server declines or cannot take goes to another one (max_rounds bounds that)")
        HttpBackendConfig(url="http://127.0.0.1", **value)  # names a bad option now, not at the first call
        return value

    def backend_class(self) -> BackendClass:
        from verl_sf.backends.cluster import ClusterSandboxBackend

        return ClusterSandboxBackend


def _registered_config(value: Any) -> Any:
    """A mapping becomes the config its `type` names; pydantic reports its errors under the field."""
    if not isinstance(value, Mapping):
        return value
    config_class = BackendConfig.registry.get(value.get("type"))  # type: ignore[arg-type]
    if config_class is None:
        raise ValueError(f"unknown backend {value.get('type')!r}; expected one of {', '.join(BackendConfig.registry)}")
    return config_class.model_validate(value)


# Any registered config, told apart by `type` (dumped with its own fields, not just the base's).
AnyBackendConfig = Annotated[SerializeAsAny[BackendConfig], BeforeValidator(_registered_config)]

_ANY_BACKEND_CONFIG: TypeAdapter[BackendConfig] = TypeAdapter(AnyBackendConfig)


def parse_backend_config(data: Any) -> BackendConfig:
    """The config `data` (a mapping with a `type` tag) describes; pydantic's ValidationError names bad fields."""
    return _ANY_BACKEND_CONFIG.validate_python(data)
