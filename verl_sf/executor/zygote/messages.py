"""What the server and the zygote say to each other, and what a child tells the zygote.

The only module of this package the server imports.  A request line is two JSON texts joined by a
tab: the head the zygote acts on (a `Head`), then the body, which goes to the child unread (a
`RunBody` to start a run or a session, a `SessionCallBody` for a call).  A reply is one `Reply`
line, tagged with its request's id.  Children report on their fd 3 with `Record`s, told apart by
`kind`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, TypedDict, Union

RunMode = Literal["python", "exec", "jupyter", "session_python", "session_bash"]
SessionLanguage = Literal["python", "bash"]
MemoryScope = Literal["own", "shared"]  # whose cap a memory kill was for: the job's own, or all jobs' together


class LandlockConfig(TypedDict):
    abi: int
    read: list[str]  # read and execute beneath these
    devices: list[str]  # read and write these device files (/dev/null, ...)


class ZygoteConfig(TypedDict):
    isolated: bool  # the namespaces rung: each job is PID 1 of its own namespaces
    landlock: Optional[LandlockConfig]  # the landlock rung: each job in a Landlock domain of its own
    run_uids: list[int]  # [first, count]: a uid of its own per job (the landlock rung, with CAP_SETUID); [] keeps ours
    single_uid: bool  # no second uid is mapped: runs keep uid 0 of the namespace, without capabilities
    workdir: str
    home_alias: str  # a second name of every job's workdir (E2B's /home/user); "": none
    tmpdir: str
    datadir: str
    premade: list[str]  # directories made in each run's fresh mounts (Sandbox Fusion's /mnt/data in /mnt)
    sizes: dict[str, int]  # tmpfs size in bytes by mount point
    keep: dict[str, list[str]]  # entries of a per-run tmpfs mount point that lead to bound runtime dirs
    uid: int
    gid: int
    env: dict[str, str]
    preload: list[str]
    ipython: bool  # build IPython's shell while warming up: this zygote serves cells
    fetch_limit: int  # bytes of fetched files per run, all files together
    cgroups: dict[str, int]  # controller (memory, pids) -> a descriptor of the delegated directory run groups go in
    cgroup_v2: bool
    cpu_counter: str  # the controller whose run groups count a run's CPU whole (run_groups.CPU_COUNTERS); "": none
    group_prefix: str  # of the run groups' names: a delegated directory may hold every sandbox's (cpu)
    seccomp: list[str]  # syscalls refused with EPERM (plus namespace flags of clone, and clone3)
    seccomp_sockets: list[list[int]]  # socket() refused with EPERM: [family, protocol or -1 for every one]
    seccomp_self_only: dict[str, list[list[list[int]]]]  # {call: refusals, each [argument, value] pairs all unmet}
    libseccomp: str
    demote_after: float  # a run's first slice: sampled past it in wall time, demoted past it in CPU time


class Limits(TypedDict):
    timeout: float  # the stage's wall-clock limit, not counting time spent waiting for a CPU
    hard_timeout: float  # wall-clock limit from hand-over that no extension passes
    output_limit: int  # bytes per stream
    memory: int  # bytes; 0: no cap
    nproc: int


class RunHead(TypedDict):
    op: Literal["run"]
    id: int
    limits: Limits
    compile_timeout: float  # 0: no compile stage
    exec: bool  # the program runs below a PID 1 that runs no user code: PID 1's records are trusted
    hold_exit: bool  # PID 1 hands its exit_group to the zygote (exits.py): answered before its teardown


class CancelHead(TypedDict):
    op: Literal["cancel"]
    id: int


class _SessionOptions(TypedDict, total=False):
    rooted: bool  # its commands may run as root: a child with a root helper (root.py)


class SessionOpenHead(_SessionOptions):
    op: Literal["open"]
    id: int
    language: SessionLanguage
    limits: Limits


class SessionCallHead(TypedDict):
    op: Literal["call"]
    id: int
    session: int  # the id its open request had
    limits: Limits
    grace: float  # seconds an interrupted call has to stop before the session is killed


class SessionCloseHead(TypedDict):
    op: Literal["close"]
    id: int
    session: int


class SessionInterruptHead(TypedDict):
    """The call in progress in a session is interrupted as at its time-out (its client left)."""

    op: Literal["interrupt"]
    id: int
    session: int


class SessionForkHead(TypedDict):
    """Copies of an idle session, one per id in `ids` (each a session of its own from then on);
    `freeze` keeps them stopped (snapshots: started from by forking them in turn)."""

    op: Literal["fork"]
    id: int
    session: int
    ids: list[int]
    limits: Limits
    freeze: bool
    files_budget: int  # bytes the copies' files may take together: what is left of the cap over all runs


Head = Union[RunHead, CancelHead, SessionOpenHead, SessionCallHead, SessionCloseHead, SessionInterruptHead,
             SessionForkHead]


class RunBody(TypedDict, total=False):
    """What a new child reads to start a run or a session: the job's own data, which the zygote never parses."""

    mode: RunMode
    files: dict[str, str]  # path -> base64
    stdin: Optional[str]
    code: str
    argv: list[str]
    compile_argv: list[str]
    cells: list[str]
    cell_timeout: float
    fetch_files: Optional[list[str]]
    hold_exit: bool  # as the head's
    fsize: int
    nofile: int
    nproc: int
    memory: int
    output_limit: int


class SessionCallBody(TypedDict, total=False):
    """One call into a live session: code (python or bash) or cells (python)."""

    code: str
    stdin: Optional[str]
    cells: list[str]
    cell_timeout: float
    output_limit: int
    fetch_files: Optional[list[str]]


class CellRecord(TypedDict):
    kind: Literal["cell"]
    stdout: str
    stderr: str
    display: list[dict[str, object]]
    error: list[dict[str, object]]
    truncated: bool


class CompiledRecord(TypedDict):
    kind: Literal["compiled"]
    return_code: int
    cpu_time: float
    stdout: str
    stderr: str
    truncated: bool


class DoneRecord(TypedDict, total=False):
    kind: Literal["done"]
    return_code: int
    cpu_time: float
    files: dict[str, str]


class CallDoneRecord(TypedDict, total=False):
    kind: Literal["call_done"]
    return_code: int
    cpu_time: float
    files: dict[str, str]
    fetched: list[Optional[str]]  # a bash session's files, in the order asked for (null: not fetched)


class SessionReadyRecord(TypedDict):
    kind: Literal["session_ready"]


class UnstartedRecord(TypedDict):
    """An exec run's PID 1 (which runs no user code) could not start the program: a sandbox error."""

    kind: Literal["unstarted"]
    error: str


Record = Union[CellRecord, CompiledRecord, DoneRecord, CallDoneRecord, SessionReadyRecord, UnstartedRecord]


class StageResult(TypedDict, total=False):
    status: Literal["Finished", "TimeLimitExceeded", "Error"]
    return_code: Optional[int]
    execution_time: float
    cpu_time: Optional[float]
    cpu_wait_time: Optional[float]
    cpu_starved: bool
    memory_exceeded: bool
    memory_scope: MemoryScope
    stdout: str
    stderr: str
    truncated: bool


class ForkedSession(TypedDict):
    id: int
    group: Optional[str]


class ReadyReply(TypedDict):
    """The zygote's first line: it is up."""

    kind: Literal["ready"]
    id: int  # 0
    pid: int


class FailedReply(TypedDict):
    """The zygote could not do what was asked (a bug, or a resource it could not get)."""

    kind: Literal["failed"]
    id: int
    error: str


class _RunTag(TypedDict):
    kind: Literal["run"]
    id: int


class RunReply(_RunTag, StageResult, total=False):
    """A run's end."""

    compile: StageResult  # present when the run had a compile stage
    files: dict[str, str]
    cells: list[CellRecord]
    error: str  # "cancelled": its client went away


class _CallTag(TypedDict):
    kind: Literal["call"]
    id: int
    session_alive: bool  # does the session live on


class CallReply(_CallTag, StageResult, total=False):
    """A session call's end, or why the session took no call (status "Error" and `error`)."""

    files: dict[str, str]
    cells: list[CellRecord]
    error: str
    session_end: str  # why the session ended (when it did)


class _SessionTag(TypedDict):
    kind: Literal["session"]
    id: int  # the session's open id
    session_alive: bool


class SessionReply(_SessionTag, total=False):
    """A session's open answered (alive, with its cgroup), or its end (sent unprompted when it dies
    between calls)."""

    group: Optional[str]  # a new session's cgroup, below the sandbox's (its memory use is read there)
    session_end: str
    limit: bool  # it could not start for the account's process limit: capacity, not a fault


class _ForkTag(TypedDict):
    kind: Literal["fork"]
    id: int
    status: Literal["Finished", "Error"]
    session_alive: bool  # does the forked session live on


class ForkReply(_ForkTag, total=False):
    sessions: list[ForkedSession]  # the copies, when every one was made
    busy: bool  # refused for the session's state (a call, threads, background processes), not a fault
    limit: bool  # capacity, not a fault: the copies' processes (RLIMIT_NPROC) or files (the memory cap) do not fit
    error: str


class ClosedReply(TypedDict):
    """A close's answer: every process of the session is killed (its teardown comes after)."""

    kind: Literal["closed"]
    id: int


Reply = Union[ReadyReply, FailedReply, RunReply, CallReply, SessionReply, ForkReply, ClosedReply]
Outcome = Union[RunReply, CallReply, FailedReply]
"""What a run or a session call is answered with."""


ZYGOTE_LEAF = "zygote"
"""cgroup v2: the group below a sandbox's own that its processes live in.  A group that hands
controllers to its children (the run groups) may hold no process itself, so the zygote moves there
before it forks anything, and the server moves bubblewrap's processes after it."""
PROCESS_LIMIT = ("the sandbox's account is at its process limit (fork: EAGAIN), which every run, session and fork "
                 "of that account counts against")
TRUNCATION_MARKER = "\n[verl-sf: output truncated, {dropped} more bytes not shown]\n"
"""Appended to a stream (or a cell's) past its output limit."""
DISPLAYS_LEFT_OUT = "\n[verl-sf: {count} of this cell's displays left out: {why}]\n"
"""Appended to a cell's stderr whose displays, together, are too bulky to parse cheaply (`wire.bulk_of`),
or come past the displays a run may send (`job.MAX_DISPLAYS`)."""
NOTE = "application/vnd.verl-sf.execution+json"
"""The MIME type of the bundle an E2B execution's cell shows last (guest.py): the execution's count, and
which bundle before it, if any, is its result."""


def kept_displays(shown: list[Any], first: int, main: Optional[int]) -> list[Any]:
    """What a cell keeps of its displays when those past the `first` are left out: those, its result
    (the bundle at index `main`, Jupyter's execute_result: what a client reads as the cell's value),
    and an E2B execution's note, last as it must be, its index of the result made to match."""
    kept = shown[:first]
    note = shown[-1] if shown and isinstance(shown[-1], dict) and NOTE in shown[-1] else None
    result = None
    if main is not None and 0 <= main < len(shown) - (note is not None):
        if main >= first:
            kept.append(shown[main])
        result = min(main, len(kept) - 1)
    if note is not None:
        noted = note[NOTE] if isinstance(note[NOTE], dict) else {}
        kept.append({NOTE: {**noted, "main": result}})
    return kept
