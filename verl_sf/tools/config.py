"""The tool's config block: verl's old keys, plus the backend choice, validated up front.

verl hands the tool the `config:` mapping of the tool yaml as a plain dict.  A typo or a
wrong type there would otherwise surface hours into a run (or never), so every key is
checked here and a bad one raises `ToolConfigError` naming it.  The backend keys
(`backend`, `sandbox_fusion_url`, and the `http:` / `local:` / `daytona:` / `cluster:` block of the chosen
backend) become one typed `BackendConfig` (`ToolConfig.backend_config`).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from verl_sf.backends.config import BACKEND_CONFIGS, BackendConfig
from verl_sf.errors import VerlSfError
from verl_sf.models import MAX_TIMEOUT_S, SANDBOX_FUSION_LANGUAGES


class ToolConfigError(VerlSfError, ValueError):
    """The tool config has a missing, unknown or ill-typed key (the message names it)."""


class ToolConfig(BaseModel):
    """Parsed `config:` of a `verl_sf.tools.SandboxFusionTool` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["native"] = "native"
    backend: str = "http"
    """http (the Sandbox Fusion API at `sandbox_fusion_url`), local (in-process executor), daytona, cluster."""
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
    session: Optional[Literal["none", "trajectory"]] = None
    """none: every call starts fresh (verl's semantics); trajectory: the calls of one trajectory share a live
    interpreter (python and bash keep variables, imports, cwd and files).  Unset: the backend's
    `default_session` (none, except daytona, whose sandbox per call would cost a sandbox start each)."""
    max_setup_snapshots: int = Field(16, gt=0)
    """Snapshots of rows' set-ups (docs/sessions.md) one tool object keeps at once; the least recently used
    is deleted to make room (the server caps its snapshots too: `--max-snapshots`)."""
    backend_config: BackendConfig
    """Built from `backend`, `sandbox_fusion_url` and the yaml block named after the backend."""

    @model_validator(mode="before")
    @classmethod
    def _gather_backend(cls, data: Any) -> Any:
        """verl's flat keys -> one tagged backend config; the block of each other backend is dropped."""
        if not isinstance(data, dict) or "backend_config" in data:
            return data
        data = dict(data)
        name = data.get("backend") or "http"
        blocks = {key: data.pop(key) for key in list(data) if key in BACKEND_CONFIGS}
        config_class = BACKEND_CONFIGS.get(name)
        if config_class is None:
            raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_CONFIGS)}")
        block = blocks.get(name) or {}
        if not isinstance(block, dict):
            raise ValueError(f"{name}: must be a mapping of {name} backend options, got {type(block).__name__}")
        data["backend"] = name
        data["backend_config"] = config_class.from_tool_block(block, sandbox_fusion_url=data.get("sandbox_fusion_url"))
        return data

    @property
    def session_mode(self) -> str:
        return self.session or self.backend_config.default_session

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

    @classmethod
    def parse(cls, config: Optional[dict[str, Any]]) -> ToolConfig:
        """Validate verl's `config:` dict; raise ToolConfigError naming each bad key."""
        try:
            return cls.model_validate(dict(config or {}))
        except ValidationError as exc:
            backend = str((config or {}).get("backend") or "http")
            problems = "; ".join(f"{_where(err['loc'], backend)}: {_reason(err)}" for err in exc.errors())
            raise ToolConfigError(f"invalid SandboxFusionTool config: {problems}") from None


def _where(loc: tuple[Any, ...], backend: str) -> str:
    """A yaml path: with `backend: local`, `backend_config.executor.slots` is the `local:` block's `slots`."""
    if loc[:1] == ("backend_config",):
        rest = loc[2:] if loc[1:2] == (backend,) else loc[1:]  # the union names the member by its tag
        config_class = BACKEND_CONFIGS.get(backend)
        if config_class is not None and config_class.tool_block_field is not None \
                and rest[:1] == (config_class.tool_block_field,):
            rest = rest[1:]
        loc = (backend, *rest)
    return ".".join(str(part) for part in loc) or "config"


def _reason(err: Any) -> str:
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown key"
    return str(err["msg"]).removeprefix("Value error, ")
