"""The Sandbox Fusion wire format, shared by every layer.

Field names, defaults and enum values follow Sandbox Fusion's own models so that its
PyPI client and verl's helpers work unchanged.  Extra response fields we add
(`queue_wait`, `truncated`) are ignored by those clients.  Every layer imports these
classes; none re-declares them.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from enum import Enum
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from verl_sf.off_loop import PIECE_CHARS

# Every language Sandbox Fusion names.  Which of them can run depends on the toolchains
# present (see verl_sf.executor.languages); an unknown name is a 422 at the edge.
SANDBOX_FUSION_LANGUAGES = (
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash",
    "typescript", "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia",
    "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift",
    "racket", "gtest", "react",
)
Language = Literal[
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash",
    "typescript", "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia",
    "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift",
    "racket", "gtest", "react",
]

# Bounds that keep a single request from pinning the server; absurd values are a 422.
MAX_TIMEOUT_S = 3600.0


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class RunStatus(str, Enum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunResult(BaseModel):
    """One stage (compile or run) of one execution.  `cpu_time` (seconds on a CPU),
    `cpu_wait_time` (seconds waiting for one, measured for runs past their first CPU slice) and
    `cpu_starved` (a time-out in which the run mostly waited for a CPU: the server's fault, not
    the code's) are verl-sf additions."""

    status: CommandRunStatus
    execution_time: Optional[float] = None
    cpu_time: Optional[float] = None
    cpu_wait_time: Optional[float] = None
    cpu_starved: bool = False
    return_code: Optional[int] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None


class _Request(BaseModel):
    # Unknown fields are ignored (Sandbox Fusion clients send a few we do not use),
    # but wrong types are rejected instead of coerced from e.g. lists.
    model_config = ConfigDict(extra="ignore")

    files: dict[str, Optional[str]] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)
    session_id: Optional[str] = None
    """Run in this live session (POST /sessions) instead of a fresh sandbox."""

    _files = field_validator("files")(classmethod(lambda cls, v: _check_files(v)))

    @field_validator("fetch_files")
    @classmethod
    def _fetchable(cls, paths: list[str]) -> list[str]:
        """A path that would leave the run's directories ('..', a symlink, elsewhere) is left out
        of the answer by the sandbox, as a missing file is; only malformed ones are refused here."""
        for path in paths:
            if not path or "\x00" in path:
                raise ValueError(f"file path {path!r} must be non-empty and without NUL characters")
        return paths


RUN_DIRECTORIES = ("/workdir", "/tmp", "/mnt/data")
NAME_MAX, PATH_MAX = 255, 4096  # <linux/limits.h>: a path's name, and a path with its NUL
"""Where a run's files may be written: relative paths go to /workdir, absolute ones under one of these."""


def _check_relative_path(path: str) -> None:
    """Relative paths are resolved in the run's working directory, absolute ones under its /tmp or
    /mnt/data; '..' is refused outright (the sandbox also resolves without following symlinks)."""
    parts = path.split("/")
    if not path or ".." in parts or "\x00" in path:
        raise ValueError(f"file path {path!r} must be non-empty and must not contain '..'")
    if path.startswith("/") and not any(path.startswith(d + "/") for d in RUN_DIRECTORIES):
        raise ValueError(f"file path {path!r} must be relative or under {', '.join(RUN_DIRECTORIES)}")


_BLANK = re.compile(r"\s")


def _check_base64(content: str) -> None:
    """binascii.Error unless `content` is base64 (blanks anywhere), checked a piece at a time: a request's
    tens of MB are parsed in a thread, where one call on them all holds the GIL throughout."""
    if any(_BLANK.search(content, at, at + PIECE_CHARS) for at in range(0, len(content), PIECE_CHARS)):
        content = "".join(word for at in range(0, len(content), PIECE_CHARS)
                          for word in content[at:at + PIECE_CHARS].split())
    quanta = 4 * PIECE_CHARS  # pieces of whole quanta, the last one to two of them long: padding only there
    last = max(0, (len(content) // quanta - 1) * quanta)
    for at in range(0, last, quanta):
        piece = content[at:at + quanta]
        if "=" in piece:
            raise binascii.Error("padding before the end")
        base64.b64decode(piece, validate=True)
    base64.b64decode(content[last:], validate=True)


def _check_files(files: dict[str, Optional[str]]) -> dict[str, Optional[str]]:
    """Paths as `_check_relative_path` says, each naming a file (not `.`, not ending in `/`) and none
    inside another (`x` and `x/y`); contents base64 (line breaks, as MIME wraps it, allowed).  What
    the sandbox could not write would otherwise end the run as the code's own failure."""
    targets = set()
    for path, content in files.items():
        _check_relative_path(path)
        if path.endswith("/") or path.rsplit("/", 1)[-1] == ".":
            raise ValueError(f"file path {path!r} names a directory, not a file")
        target = posixpath.join("/workdir", path)
        if len(target.encode()) >= PATH_MAX or any(len(part.encode()) > NAME_MAX for part in path.split("/")):
            raise ValueError(f"file path {path[:64]!r}... is longer than Linux allows ({NAME_MAX} bytes a name, "
                             f"{PATH_MAX - 1} in all)")
        if content is not None:
            try:
                _check_base64(content)
            except binascii.Error as exc:
                raise ValueError(f"file {path!r}: its content is not base64 ({exc})") from None
        targets.add(posixpath.normpath(posixpath.join("/workdir", path)))
    for target in targets:
        parent = posixpath.dirname(target)
        while parent != "/":
            if parent in targets:
                raise ValueError(f"file path {parent!r} is also a directory of {target!r}")
            parent = posixpath.dirname(parent)
    return files


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: Any) -> Any:
    """Text that UTF-8 can carry into the sandbox: JSON's `\\ud800` escapes decode to lone
    surrogates, which no file, pipe or argument can hold."""
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str) and not text.isascii():
            for at in range(0, len(text), PIECE_CHARS):  # a piece at a time: a request's 50 MB is parsed in a thread
                lone = _SURROGATE.search(text, at, at + PIECE_CHARS)
                if lone is not None:
                    raise ValueError(f"must be Unicode text that UTF-8 can encode: a lone surrogate "
                                     f"(U+{ord(lone.group()):04X}) at position {lone.start()}")
    return value


def _check_memory(value: int) -> int:
    if value != -1 and not (16 <= value <= 1024 * 1024):
        raise ValueError(f"must be -1 (server default) or between 16 and 1048576 MB, got {value}")
    return value


def _check_timeout(value: float) -> float:
    if not (0 < value <= MAX_TIMEOUT_S):
        raise ValueError(f"must be > 0 and <= {MAX_TIMEOUT_S:g} seconds, got {value!r}")
    return value


class RunCodeRequest(_Request):
    """POST /run_code body."""

    code: str
    language: Language
    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1
    stdin: Optional[str] = None

    _timeouts = field_validator("compile_timeout", "run_timeout")(classmethod(lambda cls, v: _check_timeout(v)))

    _memory = field_validator("memory_limit_MB")(classmethod(lambda cls, v: _check_memory(v)))

    _text = field_validator("code", "stdin")(classmethod(lambda cls, v: check_text(v)))


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: Optional[CommandRunResult] = None
    run_result: Optional[CommandRunResult] = None
    executor_pod_name: Optional[str] = None
    files: dict[str, str] = Field(default_factory=dict)
    # verl-sf additions, ignored by Sandbox Fusion clients.
    queue_wait: Optional[float] = None
    truncated: bool = False
    session_id: Optional[str] = None
    session_alive: Optional[bool] = None
    """For a call in a session: False when the call ended it (killed at its time-out, for memory, by exit)."""


class RunJupyterRequest(_Request):
    """POST /run_jupyter body.  Unlike Sandbox Fusion, both time-outs are enforced."""

    cells: list[str]
    cell_timeout: float = 0  # 0: no per-cell limit, only total_timeout
    total_timeout: float = 45
    kernel: Literal["python3"] = "python3"

    _text = field_validator("cells")(classmethod(lambda cls, v: check_text(v)))

    @field_validator("cell_timeout")
    @classmethod
    def _cell_timeout(cls, value: float) -> float:
        return value if value == 0 else _check_timeout(value)

    @field_validator("total_timeout")
    @classmethod
    def _total_timeout(cls, value: float) -> float:
        return _check_timeout(value)


class CellRunResult(BaseModel):
    stdout: str = ""
    stderr: str = ""
    display: list[dict[str, Any]] = Field(default_factory=list)
    error: list[dict[str, Any]] = Field(default_factory=list)


class RunJupyterResponse(BaseModel):
    status: RunStatus
    message: str = ""
    driver: Optional[CommandRunResult] = None
    cells: list[CellRunResult] = Field(default_factory=list)
    executor_pod_name: Optional[str] = None
    files: dict[str, str] = Field(default_factory=dict)
    queue_wait: Optional[float] = None
    truncated: bool = False
    session_id: Optional[str] = None
    session_alive: Optional[bool] = None
    """For a call in a session: False when the call ended it (killed at its time-out, for memory, by exit)."""


SessionLanguage = Literal["python", "bash"]


class SessionCreateRequest(BaseModel):
    """POST /sessions body: a live interpreter that keeps its state across calls."""

    model_config = ConfigDict(extra="forbid")

    language: SessionLanguage = "python"
    memory_limit_MB: int = -1
    idle_ttl_s: Optional[float] = None
    """Seconds without a call after which the session ends (default: the server's)."""
    files: dict[str, Optional[str]] = Field(default_factory=dict)
    from_snapshot: Optional[str] = None
    """Start from this snapshot's state (POST /sessions/{id}/snapshot) instead of a fresh interpreter;
    `language` and `files` must then be left out."""

    _memory = field_validator("memory_limit_MB")(classmethod(lambda cls, v: _check_memory(v)))
    _files = field_validator("files")(classmethod(lambda cls, v: _check_files(v)))

    @field_validator("idle_ttl_s")
    @classmethod
    def _ttl(cls, value: Optional[float]) -> Optional[float]:
        return value if value is None else _check_timeout(value)


class SessionInfo(BaseModel):
    """What POST /sessions and GET /sessions/{id} answer."""

    session_id: str
    language: SessionLanguage
    alive: bool
    created_at: float
    """Unix time."""
    idle_since: float
    """Unix time of the last call's end (or of creation)."""
    idle_ttl_s: float
    calls: int
    memory_bytes: Optional[int] = None
    """Memory the session uses now (its cgroup), when the server has cgroups."""
    memory_limit_MB: int
    executor_pod_name: Optional[str] = None


MAX_FORK_COUNT = 256  # forks per request; the server's own cap (--max-sessions) may be lower


class SessionForkRequest(BaseModel):
    """POST /sessions/{id}/fork body: `count` copies of an idle session's live state."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=1, le=MAX_FORK_COUNT, strict=True)  # `true` or `2.0` is not a count
    reseed: bool = Field(default=False, strict=True)  # `"yes"` or `0` is not a choice
    """Reseed the forks' random generators (random, numpy; bash's $RANDOM): by default each fork
    draws what its parent would have drawn next, as after fork(2)."""
    idle_ttl_s: Optional[float] = None
    """The forks' idle time-out (default: the parent's)."""

    @field_validator("idle_ttl_s")
    @classmethod
    def _ttl(cls, value: Optional[float]) -> Optional[float]:
        return value if value is None else _check_timeout(value)


class SessionForkResponse(BaseModel):
    session_ids: list[str]


class SnapshotInfo(BaseModel):
    """POST /sessions/{id}/snapshot answer and GET /snapshots entries: a frozen copy of a session."""

    snapshot_id: str
    language: SessionLanguage
    created_at: float
    """Unix time."""
    expires_at: float
    """Unix time after which the snapshot is deleted."""
    sessions_started: int = 0
    memory_limit_MB: int


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


def summarize_status(compile_result: Optional[CommandRunResult], run_result: Optional[CommandRunResult]) -> RunStatus:
    """Sandbox Fusion's rule: any Error stage is SandboxError, any time-out or non-zero exit Failed."""
    stages = [r for r in (compile_result, run_result) if r is not None]
    if any(r.status == CommandRunStatus.Error for r in stages):
        return RunStatus.SandboxError
    for r in stages:
        if r.status == CommandRunStatus.TimeLimitExceeded or r.return_code != 0:
            return RunStatus.Failed
    return RunStatus.Success
