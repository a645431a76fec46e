"""Executor settings: one dataclass, filled from `verl-sf serve` flags or by library users."""

from __future__ import annotations

import dataclasses
import enum
import os
import sys

from verl_sf.executor.languages import default_runtime_dir

# Every warm interpreter imports these (cheap, stdlib); heavier ones also import one of `preload`.
# Not `random` (nor `statistics`, which imports it) or `threading`: they register fork hooks that
# every forked run would pay for, used or not; a run that needs them imports them itself.
STDLIB_PRELOAD = ("math", "json", "re", "collections", "itertools", "functools", "fractions", "decimal",
                "heapq", "bisect", "string", "datetime", "atexit", "types", "linecache", "traceback", "io")
DEFAULT_PRELOAD = ("numpy", "sympy", "scipy")
CELLS = "+ipython"
"""The suffix of a flavor's twin that serves cells: the same libraries, and IPython's shell built."""
RUN_MEMORY_ESTIMATE_MB = 48
"""What one run in flight is assumed to hold, to size the in-flight cap from the machine's memory."""


def _memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError):
        return 8192


def default_runs_memory_mb() -> int:
    """All runs together: the machine's memory less a reserve (an eighth, at least 1 GB) that the
    server and the rest of the machine keep whatever the runs do."""
    total = _memory_mb()
    return max(512, total - max(1024, total // 8))


def default_max_in_flight() -> int:
    """Runs admitted at once: enough for verl's 32-thread reward client beside a rollout batch
    of 256, and more on machines whose memory holds more."""
    return max(512, min(4096, _memory_mb() // RUN_MEMORY_ESTIMATE_MB))


CONFIG_ALIASES = {"workers": "slots", "max_queue": "max_in_flight"}
"""Earlier names of settings, still accepted in configs."""


class IsolationMode(str, enum.Enum):
    """The isolation rung (rungs.py): `auto` (the strongest this host allows), `namespaces`
    (bubblewrap + namespaces + cgroups + seccomp), `landlock` (Landlock + seccomp + a uid per run +
    rlimits: no namespaces needed), `none` (plain child processes, unsafe).  `sandbox` is the
    earlier name of `namespaces`."""

    auto = "auto"
    namespaces = "namespaces"
    landlock = "landlock"
    none = "none"

    @classmethod
    def _missing_(cls, value: object) -> IsolationMode | None:
        return cls.namespaces if value == "sandbox" else None


# A run holds its slot across hops between the server, its zygote and its processes, and while its
# reply waits for the server's loop: at 2 a core the CPUs idled under load (docs/scheduling.md).
SLOTS_PER_CORE = 8


@dataclasses.dataclass
class ExecutorConfig:
    slots: int = SLOTS_PER_CORE * (os.cpu_count() or 1)
    """CPU slots: runs in their first CPU slice at once.  A run gives its slot up after `cpu_slice_s`
    and goes on at the lowest CPU priority, so fresh runs never wait behind long ones."""
    cpu_slice_s: float = 0.1
    max_in_flight: int = dataclasses.field(default_factory=default_max_in_flight)
    """Runs admitted (waiting for a slot or running); beyond that the server answers 503."""
    sandboxes: int = max(1, os.cpu_count() or 1)
    """Warm interpreters per flavor, each in its own sandbox; runs are spread over them."""
    isolation: IsolationMode = IsolationMode.auto
    fast_path: bool = True
    """Serve `python` from the pre-warmed interpreter (fork per run) instead of `python3 main.py`."""
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    """Heavy libraries a warm interpreter per library (and a "full" one with all) imports.  Code
    that names one of them is forked from it; other code from the lean one, whose fork and exit
    cost a fraction (fork time grows with the parent's memory)."""
    default_memory_mb: int = 2048
    """Cap applied when a request says memory_limit_MB=-1."""
    runs_memory_mb: int = dataclasses.field(default_factory=default_runs_memory_mb)
    """Cap on the memory of all runs and sessions together (the cgroup above every sandbox's; the zygotes
    are outside it on cgroup v1).  The runs' own caps may add up past it; a burst that reaches it has runs
    killed for memory, never the server."""
    output_limit_bytes: int = 1 << 20
    """Per stream (stdout, stderr) kept and returned; the rest is counted and marked as cut."""
    workdir_size_mb: int = 256
    tmp_size_mb: int = 64
    max_file_size_mb: int = 256
    max_processes: int = 256
    """Processes and threads per run (its pids cgroup; RLIMIT_NPROC where there is none)."""
    max_open_files: int = 1024
    fetch_file_limit_bytes: int = 32 << 20
    python: str = sys.executable
    """Interpreter of the runtime the code sees (a venv with the scientific stack)."""
    sandbox_uid: int = 1000
    """uid (inside the sandbox) that code runs as."""
    host_uid_base: int = 100000
    """As root: the sandbox's uid 0 is this host uid and its run uid this plus `sandbox_uid`; neither is
    a real account (the usual start of /etc/subuid ranges)."""
    reply_margin_s: float = 2.5
    """A reply leaves this long before the client's deadline (run_timeout + compile_timeout + 10 s)."""
    max_sessions: int = 512
    session_idle_ttl_s: float = 600.0
    session_max_lifetime_s: float = 3600.0
    session_interrupt_grace_s: float = 2.0
    """A timed-out session call is interrupted (KeyboardInterrupt); one still running this long after is killed."""
    max_snapshots: int = 64
    """Frozen session copies kept at once (POST /sessions/{id}/snapshot beyond it: 503)."""
    snapshot_ttl_s: float = 3600.0
    """Seconds a snapshot is kept after it was taken."""
    gpus: str = ""
    """NVIDIA GPUs GPU runs (cuda, python_gpu) may use: "all", indices such as "0,1", or "" (none: those
    languages are refused)."""
    runs_per_gpu: int = 1
    """GPU runs on one GPU at a time; each holds its GPU slot for its whole run."""
    pod_name: str = dataclasses.field(default_factory=lambda: os.uname().nodename)
    runtime_dir: str = dataclasses.field(default_factory=default_runtime_dir)
    """verl-sf's own runtime directory (npm packages for nodejs, jest, typescript), bound read-only."""

    def memory_mb(self, requested: int) -> int:
        """A request's memory cap: its own, or `default_memory_mb` where it says -1."""
        return self.default_memory_mb if requested == -1 else requested

