"""The tool's config block: verl's old keys, plus the backend choice, validated up front.

verl hands the tool the `config:` mapping of the tool yaml as a plain dict.  A typo or a
wrong type there would otherwise surface hours into a run (or never), so every key is
checked here and a bad one raises `ToolConfigError` naming it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from verl_sf.backends.daytona import DaytonaOptions
from verl_sf.models import MAX_TIMEOUT_S, SANDBOX_FUSION_LANGUAGES

BackendName = Literal["http", "local", "daytona", "cluster"]


class ToolConfigError(ValueError):
    """The tool config has a missing, unknown or ill-typed key (the message names it)."""


class ToolConfig(BaseModel):
    """Parsed `config:` of a `verl_sf.tools.SandboxFusionTool` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["native"] = "native"
    backend: Optional[BackendName] = None
    """http (the Sandbox Fusion API at `sandbox_fusion_url`), local (in-process executor), daytona,
    cluster (the Ray-placed fleet of `verl-sf cluster up`: the caller's own node's server first)."""
    sandbox_fusion_url: Optional[str] = None
    num_workers: int = Field(10, gt=0)
    """Concurrent calls one tool object runs at once (verl's meaning: its pool actor's slots)."""
    rate_limit: int = Field(10, gt=0)
    """Executions in flight across the whole Ray cluster (verl's meaning: a cap, not per second)."""
    enable_global_rate_limit: bool = True
    default_timeout: float = Field(30, gt=0, le=MAX_TIMEOUT_S)
    default_language: str = "python"
    memory_limit_mb: int = 1024
    extract_code_block: bool = False
    """ReTool: run the first ```python block of the argument instead of the whole text."""
    print_last_expression: bool = False
    """ReTool: print the value of a trailing bare expression, as a REPL would."""
    max_output_chars: int = Field(8192, gt=0)
    """Cap on the text returned to the model (head and tail kept, cut marked)."""
    pool: Literal["auto", "ray", "ray_actor", "inprocess"] = "auto"
    """ray: run in this process under a permit of the cluster-wide limiter; ray_actor: in an
    ExecutionWorker actor behind the same limiter; inprocess: an asyncio limiter in this
    process (no Ray needed); auto: ray when Ray is initialized, else inprocess."""
    http: dict[str, Any] = Field(default_factory=dict)
    """`http:` sub-block: HttpSandboxBackend options (max_retries, backoff_base_s, ...)."""
    local: dict[str, Any] = Field(default_factory=dict)
    """`local:` sub-block: ExecutorConfig fields for the in-process executor."""
    daytona: DaytonaOptions = Field(default_factory=DaytonaOptions)
    cluster: dict[str, Any] = Field(default_factory=dict)
    """`cluster:` sub-block: ClusterSandboxBackend options (namespace, address, spill_at, http, ...)."""

    @field_validator("default_language")
    @classmethod
    def _language(cls, value: str) -> str:
        if value not in SANDBOX_FUSION_LANGUAGES:
            raise ValueError(f"unknown language {value!r}; expected one of {', '.join(SANDBOX_FUSION_LANGUAGES)}")
        return value

    @field_validator("memory_limit_mb")
    @classmethod
    def _memory(cls, value: int) -> int:
        if value != -1 and not (16 <= value <= 1024 * 1024):
            raise ValueError(f"must be -1 (server default) or between 16 and 1048576 MB, got {value}")
        return value

    @model_validator(mode="after")
    def _backend_choice(self) -> "ToolConfig":
        if self.resolved_backend == "http" and not self.sandbox_fusion_url:
            raise ValueError("sandbox_fusion_url is required for the http backend "
                             "(or set backend: local / backend: daytona)")
        return self

    @property
    def resolved_backend(self) -> BackendName:
        return self.backend or "http"

    @classmethod
    def parse(cls, config: Optional[dict[str, Any]]) -> "ToolConfig":
        """Validate verl's `config:` dict; raise ToolConfigError naming each bad key."""
        try:
            return cls.model_validate(dict(config or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {_reason(err)}" for err in exc.errors()
            )
            raise ToolConfigError(f"invalid SandboxFusionTool config: {problems}") from None


def _reason(err: Any) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    return str(err["msg"]).removeprefix("Value error, ")
