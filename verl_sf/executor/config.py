"""Executor settings: one dataclass, filled from `verl-sf serve` flags or by library users."""

from __future__ import annotations

import dataclasses
import enum
import os
import sys

from verl_sf.executor.languages import default_runtime_dir

# Every warm interpreter imports these (cheap, stdlib); the "full" one also imports `preload`.
# Not `random` (nor `statistics`, which imports it) or `threading`: they register fork hooks
# (reseed; rebuild the thread state) that every forked run would pay for, ~0.25 and ~0.4 ms of
# CPU here, used or not; a run that needs them imports them in ~1-2 ms.
LEAN_PRELOAD = ("math", "json", "re", "collections", "itertools", "functools", "fractions", "decimal",
                "heapq", "bisect", "string", "datetime", "atexit", "types", "linecache", "traceback", "io")
DEFAULT_PRELOAD = ("numpy", "sympy", "scipy")


class IsolationMode(str, enum.Enum):
    """`sandbox`: bubblewrap + namespaces + cgroups.  `none`: plain child processes (unsafe)."""

    sandbox = "sandbox"
    none = "none"


@dataclasses.dataclass
class ExecutorConfig:
    workers: int = max(4, 2 * (os.cpu_count() or 1))
    """Sandbox slots, i.e. runs executing at once; each is one warm interpreter."""
    max_queue: int = 1024
    """Requests allowed to wait for a slot; beyond that the server answers 503."""
    isolation: IsolationMode = IsolationMode.sandbox
    fast_path: bool = True
    """Serve `python` from the pre-warmed interpreter (fork per run) instead of `python3 main.py`."""
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    """Heavy libraries a second, "full" warm interpreter per slot imports.  Code that names one
    of them is forked from it; other code from the lean one, whose fork and exit cost a
    fraction (fork time grows with the parent's memory)."""
    default_memory_mb: int = 2048
    """Cap applied when a request says memory_limit_MB=-1."""
    output_limit_bytes: int = 1 << 20
    """Per stream (stdout, stderr) kept and returned; the rest is counted and marked as cut."""
    workdir_size_mb: int = 256
    tmp_size_mb: int = 64
    max_file_size_mb: int = 256
    max_processes: int = 256
    """Processes and threads per run (RLIMIT_NPROC, and the slot's pids cgroup)."""
    max_open_files: int = 1024
    fetch_file_limit_bytes: int = 32 << 20
    python: str = sys.executable
    """Interpreter of the runtime the code sees (a venv with the scientific stack)."""
    sandbox_uid: int = 1000
    """uid (inside the sandbox) that code runs as; mapped to the host's `nobody`."""
    pod_name: str = dataclasses.field(default_factory=lambda: os.uname().nodename)
    runtime_dir: str = dataclasses.field(default_factory=default_runtime_dir)
    """verl-sf's own runtime directory (npm packages for nodejs, jest, typescript), bound read-only."""
