"""The warm interpreter inside one sandbox: it forks a fresh child per run and per session.

This file is executed as a standalone script (`python -I -c <source>`) inside the bubblewrap
sandbox, so it imports only the standard library and never the `verl_sf` package (the sandbox
does not see the server's files); the executor imports its message types.  It never runs user
code itself: every run and every session is a child forked from this pristine, pre-imported
interpreter, so no per-run interpreter start or library import is paid.

One zygote serves many runs at once.  Each child gets, before it sees its job (a child is
forked ahead of time and waits on a pipe): its own PID namespace (it is PID 1 there, so all it
starts dies with it), mount and IPC namespaces, fresh size-capped tmpfs mounts on /workdir,
/tmp and /mnt/data (private to it and gone with it: nothing is ever wiped or opened by a
privileged process on a run's behalf), its own cgroup (memory and pids caps), the run's
unprivileged uid with no capabilities and no_new_privs, and the seccomp filter.  Network,
UTS and the read-only system view come from the sandbox's bubblewrap.

Protocol: requests on fd 0, replies on fd 1, one per line.  A request line is two JSON texts
joined by a tab (JSON never holds a raw tab): the head this process acts on (a `Head`), then the
body, which goes to the child unread.  A reply is one JSON object (a `Reply`), tagged with the
request's `id`; replies come in completion order.
"""

import _thread
import ast
import atexit
import base64
import contextlib
import ctypes
import errno
import fcntl
import gc
import io
import json
import linecache
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
import types
from typing import Literal, Optional, TypedDict, Union

# ---- messages (the executor imports these; keep them standard-library `typing` only) ----------
RunMode = Literal["python", "exec", "jupyter"]
SessionLanguage = Literal["python", "bash"]


class ZygoteConfig(TypedDict):
    isolated: bool
    single_uid: bool  # no second uid is mapped: runs keep uid 0 of the namespace, without capabilities
    workdir: str
    tmpdir: str
    datadir: str
    premade: list[str]  # directories made in each run's fresh mounts (SF's /mnt/data in /mnt)
    sizes: dict[str, int]  # tmpfs size in bytes by mount point
    keep: dict[str, list[str]]  # entries of a per-run tmpfs mount point that lead to bound runtime dirs
    uid: int
    gid: int
    env: dict[str, str]
    preload: list[str]
    fetch_limit: int
    cgroups: dict[str, int]  # controller (memory, pids) -> a descriptor of the delegated directory run groups go in
    cgroup_v2: bool
    seccomp: list[str]  # syscalls refused with EPERM (plus namespace flags of clone, and clone3)
    seccomp_socket_families: list[int]  # socket() refused with EPERM for these address families
    libseccomp: str
    demote_after: float  # seconds of wall time after which a run drops to the lowest CPU priority


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


class CancelHead(TypedDict):
    op: Literal["cancel"]
    id: int


class SessionOpenHead(TypedDict):
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


Head = Union[RunHead, CancelHead, SessionOpenHead, SessionCallHead, SessionCloseHead]


class RunBody(TypedDict, total=False):
    """What the child reads: the run's own data, which this process never parses."""

    mode: RunMode
    files: dict[str, str]  # path -> base64
    stdin: Optional[str]
    code: str
    argv: list[str]
    compile_argv: list[str]
    cells: list[str]
    cell_timeout: float
    fetch_files: list[str]
    fsize: int
    nofile: int
    nproc: int


class StageResult(TypedDict, total=False):
    status: Literal["Finished", "TimeLimitExceeded", "Error"]
    return_code: Optional[int]
    execution_time: float
    cpu_time: Optional[float]
    cpu_wait_time: Optional[float]
    cpu_starved: bool
    memory_exceeded: bool
    memory_scope: Literal["own", "shared"]  # whose cap the kill was for: the run's own, or all runs' together
    stdout: str
    stderr: str


class Reply(StageResult, total=False):
    id: int
    compile: StageResult  # present when the run had a compile stage
    files: dict[str, str]
    cells: list[dict]
    truncated: bool
    error: str  # the zygote could not do what was asked (a bug, or a resource it could not get)
    session_alive: bool  # a session's reply: does the session live on
    session_end: str  # why a session ended (sent unprompted when it dies between calls)
    group: Optional[str]  # a new session's cgroup, below the sandbox's (its memory use is read there)


# ---- constants --------------------------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                   CLONE_NEWNET, CLONE_NEWTIME)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
PR_SET_DUMPABLE, PR_SET_NAME, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 4, 15, 24, 38, 22
SECCOMP_MODE_FILTER = 2
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08
SYS_OPENAT2 = 437
SCMP_ERROR = -1  # __NR_SCMP_ERROR: libseccomp does not know the name
# System calls added since 5.1 have one number on every architecture; these are the ones an
# older libseccomp may not resolve.  Everything from FIRST_UNKNOWN_SYSCALL on is refused.
NEW_SYSCALLS = {"memfd_secret": 447, "cachestat": 451, "fchmodat2": 452, "map_shadow_stack": 453,
                "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456, "statmount": 457, "listmount": 458,
                "lsm_get_self_attr": 459, "lsm_set_self_attr": 460, "lsm_list_modules": 461, "mseal": 462}
FIRST_UNKNOWN_SYSCALL = 463
UNKNOWN_SYSCALLS_REFUSED = 128
READY_NAME = b"verl-sf-ready"  # what `ps` shows for a child waiting for its job
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
READ_CHUNK = 1 << 16
TRUNCATION_MARKER = "\n[verl-sf: output truncated, {dropped} more bytes not shown]\n"
KILL_WAIT = 5.0  # seconds a killed run's PID 1 has to be gone before the reply leaves without it
TICK = 0.2  # seconds between CPU-wait samples of long runs (and memory samples, without a memory cgroup)
IDLE_SESSION_TICK = 1.0  # seconds between memory samples of an idle session without a memory cgroup
# A call is `code NUL fetch-limit NUL path NUL ... NUL` on fd 9.  The shell fetches the files itself, as the
# run's user in the session's own mounts, and reports them in order ("fetched": base64 or null per path).
BASH_SESSION = r"""trap 'builtin printf "\nKeyboardInterrupt\n" >&2' INT
__verl_sf_home=$PWD
while IFS= read -r -d '' __verl_sf_code <&9; do
  IFS= read -r -d '' __verl_sf_limit <&9
  __verl_sf_paths=()
  while IFS= read -r -d '' __verl_sf_path <&9 && [ -n "$__verl_sf_path" ]; do __verl_sf_paths+=("$__verl_sf_path"); done
  eval "$__verl_sf_code" 3>&- 9<&- </dev/null
  __verl_sf_status=$?
  {
    builtin printf '{"kind": "call_done", "return_code": %d, "fetched": [' "$__verl_sf_status"
    __verl_sf_sep=
    for __verl_sf_path in "${__verl_sf_paths[@]}"; do
      case $__verl_sf_path in
        */../*|*/..|../*) __verl_sf_path= ;;
        "$__verl_sf_home"/*|/tmp/*|/mnt/data/*) ;;
        /*) __verl_sf_path= ;;
        *) __verl_sf_path=$__verl_sf_home/$__verl_sf_path ;;
      esac
      # No symlink anywhere on the path: resolving it must not change it.
      if [ -n "$__verl_sf_path" ] && [ -f "$__verl_sf_path" ] \
          && [ "$(command realpath -e -- "$__verl_sf_path" 2>/dev/null)" \
               = "$(command realpath -s -m -- "$__verl_sf_path")" ] \
          && [ "$(command stat -c %s -- "$__verl_sf_path")" -le "$__verl_sf_limit" ]; then
        builtin printf '%s"' "$__verl_sf_sep"; command base64 -w0 -- "$__verl_sf_path"; builtin printf '"'
      else
        builtin printf '%snull' "$__verl_sf_sep"
      fi
      __verl_sf_sep=,
    done
    builtin printf ']}\n'
  } >&3
done
"""

# First calls into these libraries import submodules and fill caches; doing them once here
# spares every forked run.
WARMUPS = {
    "sympy": "import sympy as sp\nx, y = sp.symbols('x y')\nsp.solve(x**2 - 4, x)\n"
             "sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)\n"
             "sp.factor(x**2 - y**2)\nsp.integrate(x**2, x)\nsp.diff(sp.exp(x) * x, x)\nsp.Rational(1, 3) + 1\n"
             "sp.sqrt(8)\nsp.N(sp.pi, 10)\nsp.Matrix([[1, 2], [3, 4]]).det()\nsp.limit(sp.sin(x) / x, x, 0)\n",
    "numpy": "import numpy as np\na = np.arange(10)\na.sum(); a.mean(); np.linalg.inv(np.eye(3))\n"
             "np.random.default_rng(0).random(3)\n",
    "scipy": "import scipy.optimize, scipy.special, scipy.stats, scipy.integrate, scipy.linalg\n",
}

# Generators that libraries seed once, at import: every forked run would replay the same
# numbers, where a fresh `python main.py` draws new ones.  The zygote reseeds them (from OS
# entropy) before each fork, where it costs no copy-on-write faults.
RESEEDED_MODULES = ("numpy.random", "sympy.core.random")

# JSON through the C scanner and encoder directly: json.loads/dumps' Python layers touch pages
# that a process forked a moment ago must copy.
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_encode_json = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
# Looked up (dlsym) once here rather than in every run, whose lookups would copy pages.
for _name in ("capget", "capset", "mount", "prctl", "setns", "unshare", "syscall"):
    getattr(_libc, _name)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _set_capabilities(keep_effective):
    """Empty the inheritable set (and, unless `keep_effective`, every set)."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = 0
        if not keep_effective:
            half.effective = half.permitted = 0
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _shrink_capabilities():
    """Empty the bounding set for good, keeping the effective capabilities the zygote needs
    (namespaces, mounts, uid changes): an exec in a run can never regain one."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _set_capabilities(keep_effective=True)


def _seccomp_program(config):
    """The run's seccomp filter, compiled once by libseccomp and exported as a BPF program that
    each child loads with one prctl (compiling per run would cost far more than the fork)."""
    lib = ctypes.CDLL(config["libseccomp"], use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    ctx = lib.seccomp_init(allow)  # the native ABI only: 32-bit and x32 calls hit the bad-arch kill
    if not ctx:
        raise OSError("seccomp_init failed")
    lib.seccomp_attr_set(ctypes.c_void_p(ctx), 8, 2)  # SCMP_FLTATR_CTL_OPTIMIZE: a binary tree, not a list
    try:
        def number_of(name):
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number == SCMP_ERROR:  # newer than this libseccomp: the number every architecture shares
                number = NEW_SYSCALLS.get(name)
                if number is None:
                    raise OSError(errno.EINVAL, f"seccomp: cannot resolve the system call {name!r}")
            return number

        def rule(action, number, *compares):
            if number < 0:
                return  # a pseudo-number: not a system call on this architecture
            array = (_ArgCmp * max(1, len(compares)))(*compares)
            result = lib.seccomp_rule_add_array(ctx, action, number, len(compares), array)
            if result != 0:
                raise OSError(-result, f"seccomp rule for system call {number}: {os.strerror(-result)}")

        refused = {number_of(name) for name in config["seccomp"]}
        for number in refused:
            rule(eperm, number)
        rule(enosys, number_of("clone3"))  # its flags live in memory a filter cannot read; libc falls back to clone
        # Calls newer than this table: unknown, so refused as missing (runtimes fall back), never allowed.
        for number in range(FIRST_UNKNOWN_SYSCALL, FIRST_UNKNOWN_SYSCALL + UNKNOWN_SYSCALLS_REFUSED):
            if number not in refused:
                rule(enosys, number)
        equal, masked_eq = 4, 7  # SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ
        for family in config["seccomp_socket_families"]:
            rule(eperm, number_of("socket"), _ArgCmp(0, equal, family, 0))
        for flag in NAMESPACE_FLAGS:
            rule(eperm, number_of("clone"), _ArgCmp(0, masked_eq, flag, flag))
        exported = os.memfd_create("seccomp")
        try:
            result = lib.seccomp_export_bpf(ctx, exported)
            if result != 0:
                raise OSError(-result, f"seccomp_export_bpf: {os.strerror(-result)}")
            return os.pread(exported, os.fstat(exported).st_size, 0)
        finally:
            os.close(exported)
    finally:
        lib.seccomp_release(ctx)


# ---- the zygote -------------------------------------------------------------------------------
class Zygote:
    def __init__(self, config):
        self.cfg = config
        self.isolated = config["isolated"]
        with open("/proc/self/comm", "rb") as comm:
            self.comm = comm.read().strip()  # a run's name, as `python main.py` would show it
        self.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if self.isolated else -1
        # Protocol fds move out of 0/1 so children can take those numbers for their stdio.
        self.req_fd = os.dup(0)
        self.rep_fd = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        os.set_blocking(self.req_fd, False)
        os.environ.clear()  # children inherit the environment: set once here, not in every run
        os.environ.update(config["env"])
        program = _seccomp_program(config) if self.isolated and config["seccomp"] else b""
        # The filter's sock_fprog is built here once; a child only hands its address to prctl.
        self._seccomp_buffer = ctypes.create_string_buffer(program, len(program) or 1)
        self._seccomp_fprog = _SockFprog(len(program) // 8, ctypes.cast(self._seccomp_buffer, ctypes.c_char_p))
        self.seccomp = ctypes.c_void_p(ctypes.addressof(self._seccomp_fprog)) if program else None
        # Each run's tmpfs mounts, as the arguments mount(2) takes, encoded once.
        owner = 0 if config["single_uid"] else config["uid"]
        self.mounts = [(target.encode(),
                        f"size={config['sizes'][target]},mode={'1777' if target == config['tmpdir'] else '0755'},"
                        f"uid={owner},gid={owner}".encode(), target, config["keep"].get(target, ()))
                       for target in dict.fromkeys((config["workdir"], config["tmpdir"], config["datadir"]))
                       if target in config["sizes"]]
        if self.isolated:
            _shrink_capabilities()
        _install_stdio(_stdio_for_runs())  # before the preload, whose gc.freeze() then covers it
        self._preload(config["preload"])
        self.sequence = 0
        self.free_groups = []  # emptied run cgroups, reused rather than made and removed per run
        self.ready = None  # the pre-forked child waiting for its job
        self.runs = {}  # request id -> Run
        self.sessions = {}  # open request id -> Run (its current call, if any, is on it)
        self.reaping = {}  # pidfd -> Run whose answer is sent and whose PID 1 is still to collect
        self.fd_owner = {}  # fd -> Run, for the poll loop
        self.poller = select.poll()
        self.poller.register(self.req_fd, select.POLLIN)
        self.pending = bytearray()
        self.pending_scanned = 0  # bytes of `pending` already searched for a newline
        os.makedirs(config["workdir"], exist_ok=True)
        self.cwd = os.path.realpath(config["workdir"])  # what os.getcwd() gives a run
        sys.argv = ["main.py"]  # as `python main.py` has it; set here, a run need not free ours

    def _preload(self, modules):
        loaded = []
        with _threading_stand_in():
            for name in modules:
                try:
                    __import__(name)
                    loaded.append(name)
                except Exception:  # a missing optional library just is not preloaded
                    pass
            for name in loaded:
                with contextlib.suppress(Exception):  # a warm-up is only an optimisation
                    exec(WARMUPS.get(name, ""), {})
        gc.collect()
        gc.freeze()  # keeps the collector from dirtying shared pages in every child
        _collapse_heap()

    # ---- main loop -----------------------------------------------------------------------------
    def serve(self):
        self.prepare()
        self._reply({"id": 0, "ready": True, "pid": os.getpid()})
        while True:
            timeout = self._next_timer()
            events = self.poller.poll(None if timeout is None else max(0, int(timeout * 1000) + 1))
            for fd, _ in events:
                if fd == self.req_fd:
                    if not self._read_requests():
                        self._shutdown()
                        return
                    continue
                run = self.fd_owner.get(fd)
                if run is not None:
                    run.on_event(self, fd)
                elif fd in self.reaping:
                    self._reap(fd)
            now = time.monotonic()
            for run in list(self.runs.values()) + list(self.sessions.values()):
                run.on_time(self, now)
            self.prepare()

    def _next_timer(self):
        deadlines = [run.next_timer() for run in list(self.runs.values()) + list(self.sessions.values())]
        deadlines = [d for d in deadlines if d is not None]
        if not deadlines:
            return None
        return min(deadlines) - time.monotonic()

    def _read_requests(self):
        """Take every complete request line available; False once the server is gone."""
        while True:
            try:
                chunk = os.read(self.req_fd, READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                return False
            self.pending += chunk
            if len(chunk) < READ_CHUNK:
                break
        while True:
            end = self.pending.find(b"\n", self.pending_scanned)
            if end < 0:
                self.pending_scanned = len(self.pending)
                return True
            line = bytes(self.pending[:end])
            # A large body is not kept: the buffer is replaced, not shrunk in place.
            self.pending = bytearray(self.pending[end + 1:])
            self.pending_scanned = 0
            head, _, body = line.partition(b"\t")
            request = _loads(head.decode())
            try:
                self._dispatch(request, body)
            except Exception as exc:  # a bug here must not take the sandbox down silently
                self._reply({"id": request.get("id", -1), "status": "Error",
                             "error": f"verl-sf zygote error: {exc!r}\n{traceback.format_exc()}"})

    def _dispatch(self, head, body):
        op = head["op"]
        if op == "run":
            Run(self, head, body, session=None).start(self)
        elif op == "open":
            Run(self, head, body, session=head["language"]).start(self)
        elif op == "call":
            session = self.sessions.get(head["session"])
            if session is None or not session.alive:
                self._reply({"id": head["id"], "status": "Error", "session_alive": False,
                             "error": "the session is not running", "session_end": "ended"})
            else:
                session.call(self, head, body)
        elif op == "cancel":
            run = self.runs.get(head["id"])
            if run is not None:
                run.kill(self, "cancelled")
        elif op == "close":
            session = self.sessions.get(head["session"])
            if session is not None:
                session.kill(self, "closed")

    def _reply(self, reply):
        data = _dumps(reply) + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self.rep_fd, view):]

    def _shutdown(self):
        for run in list(self.runs.values()) + list(self.sessions.values()):
            _kill(run.pid, self.isolated)
        if self.ready is not None:
            for fd in self.ready[1:]:
                os.close(fd)

    # ---- children ------------------------------------------------------------------------------
    def prepare(self):
        """Fork the next child ahead of time, namespaces and all, so a request only pays for
        handing it the job.  It waits on a pipe; the zygote closing that pipe ends it."""
        if self.ready is not None:
            return
        self.sequence += 1
        groups = self._make_cgroups(self.sequence)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        meta_r, meta_w = os.pipe()
        job_r, job_w = os.pipe()
        _reseed_generators()
        if self.isolated:
            # The child becomes PID 1 of a brand-new PID namespace.
            _check(_libc.setns(self.pidns_fd, CLONE_NEWPID), "setns")
            _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (out_r, err_r, meta_r, job_w, self.req_fd, self.rep_fd):
                    os.close(fd)
                Child(self, groups).setup(job_r, out_w, err_w, meta_w)
            except BaseException:
                try:
                    os.write(2, f"verl-sf: run setup failed: {traceback.format_exc()}".encode())
                finally:
                    os._exit(126)
        for fd in (out_w, err_w, meta_w, job_r):
            os.close(fd)
        self.ready = (pid, out_r, err_r, meta_r, job_w, groups)

    def take_ready(self):
        self.prepare()
        ready, self.ready = self.ready, None
        return ready

    def _make_cgroups(self, sequence):
        """{controller: (directory fd, group name)} of a cgroup per controller for the next child."""
        if not self.cfg["cgroups"]:
            return {}
        if self.free_groups:
            return self.free_groups.pop()
        groups = {}
        for controller, base in self.cfg["cgroups"].items():
            if (base, f"run-{sequence}") not in groups.values():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(f"run-{sequence}", 0o755, dir_fd=base)
            groups[controller] = (base, f"run-{sequence}")
        return groups

    def watch(self, run, fds):
        for fd in fds:
            self.fd_owner[fd] = run
            self.poller.register(fd, select.POLLIN)

    def unwatch(self, fd):
        self.fd_owner.pop(fd, None)
        with contextlib.suppress(KeyError):
            self.poller.unregister(fd)

    def retire(self, run):
        """The answer is out: forget the run, and collect its PID 1 once it is gone."""
        self.runs.pop(run.id, None)
        self.sessions.pop(run.id, None)
        self.unwatch(run.pidfd)
        for fd in list(run.open_fds):
            self.unwatch(fd)
            os.close(fd)
        run.open_fds.clear()
        if run.job_w >= 0:
            os.close(run.job_w)
            run.job_w = -1
        if run.collected:
            self._clean_up(run)
            return
        self.reaping[run.pidfd] = run
        self.poller.register(run.pidfd, select.POLLIN)

    def _reap(self, pidfd):
        run = self.reaping.pop(pidfd)
        self.unwatch(pidfd)
        _kill(run.pid, self.isolated)
        os.waitpid(run.pid, 0)
        self._clean_up(run)

    def _clean_up(self, run):
        """Once PID 1 is collected the kernel has ended every process of the run: its cgroups
        are empty and go back to the pool (the limits are rewritten by the next run)."""
        os.close(run.pidfd)
        if run.groups and not run.memory_exceeded:  # a group with a kill on its counter is not reused
            if "memory" in run.groups and not self.cfg["cgroup_v2"]:
                _write_group(run.groups["memory"], "memory.failcnt", "0")  # whose cap a later kill was
            self.free_groups.append(run.groups)
        else:
            for base, name in set(run.groups.values()):
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=base)
        if not self.isolated:
            shutil.rmtree(f"{self.cfg['workdir']}/run-{run.pid}", ignore_errors=True)


class Run:
    """One child seen from the zygote: a run (until its answer) or a session (until it ends).

    A run is over when the kernel says its PID 1 is gone (its PID namespace, and so every process
    it started, ended with it): the reply is sent only then, and its return code and CPU time are
    what wait4 reports.  Records the child writes on fd 3 carry only what belongs to the run itself
    (its fetched files, its cells' output), except where PID 1 runs no user code (`exec` runs,
    whose PID 1 is not dumpable: nothing of the program reaches it)."""

    def __init__(self, zygote, head, body, session):
        self.id = head["id"]
        self.head = head
        self.body = body
        self.session = session  # None for a run, else the session's language
        self.limits = head["limits"]
        self.alive = True
        self.exited = False
        self.collected = False  # its PID 1 was waited for already
        self.status = 0  # PID 1's wait status, once collected
        self.cpu_used = 0.0  # CPU seconds of PID 1 and every process it waited for (wait4's rusage)
        self.memory_exceeded = False
        self.job_w = -1
        self.killed_at = None
        self.open_fds = set()
        self.records = []
        self.meta = bytearray()
        self.meta_scanned = 0  # bytes of `meta` already searched for a newline
        self.meta_bytes = 0  # bytes received on fd 3 for this run or call
        # What fd 3 may carry: the cells' output (capped by the child), their displays and the fetched files.
        self.meta_budget = 4 * self.limits["output_limit"] + zygote.cfg["fetch_limit"] * 4 // 3 + (1 << 20)
        self.overflowed = False
        self.current_call = None  # the head of the session call in progress
        self.fetch_paths = []  # a bash session call's fetch_files, in order
        self.compile_result = None
        self.interrupted_at = None
        self.end_reason = ""
        # Without a memory cgroup, RLIMIT_DATA caps each process alone (not shared mappings, not
        # a run's many processes): the zygote then sums the run's memory every tick and kills past the cap.
        self.watch_memory = bool(self.limits["memory"]) and not zygote.cfg["cgroups"]
        self.memory_killed = False
        self.memory_checked = 0.0

    # -- start and stages ------------------------------------------------------------------------
    def start(self, zygote):
        pid, out_r, err_r, meta_r, job_w, groups = zygote.take_ready()
        self.pid, self.out_r, self.err_r, self.meta_r, self.job_w = pid, out_r, err_r, meta_r, job_w
        self.groups = groups
        self.pidfd = os.pidfd_open(pid)
        _set_cgroup_limits(groups, zygote.cfg["cgroup_v2"], self.limits)
        self.open_fds = {out_r, err_r, meta_r}  # blocking: read only when poll says there is something
        zygote.watch(self, (out_r, err_r, meta_r, self.pidfd))
        if self.session is None:
            zygote.runs[self.id] = self
        else:
            zygote.sessions[self.id] = self
        _write_all(job_w, self.body + b"\n")
        self.body = b""  # a session lives long: its creation body is not kept
        if self.session is None:
            os.close(job_w)  # a run reads its job to the end; a session keeps the pipe for calls
            self.job_w = -1
        self.hard_deadline = time.monotonic() + self.limits["hard_timeout"]  # for all stages: the client waits for all
        self._begin_stage(self.head.get("compile_timeout") or self.limits["timeout"])

    def _begin_stage(self, timeout, fresh_output=True):
        now = time.monotonic()
        self.stage_started = now
        self.stage_timeout = timeout
        self.hard_deadline = max(self.hard_deadline, now + timeout)
        if fresh_output:
            self.buffers = {self.out_r: bytearray(), self.err_r: bytearray()}
            self.dropped = 0
        self.wait_seen = 0.0  # CPU-wait of this stage, sampled for runs past their first slice
        self.wait_base = None
        self.cpu_seen = 0.0
        self.demoted = False
        self.timed_out = False
        self.starved = False

    def deadline(self):
        return min(self.stage_started + self.stage_timeout + self.wait_seen, self.hard_deadline)

    def next_timer(self):
        if self.killed_at is not None:
            return self.killed_at + KILL_WAIT
        if self.session is not None and self.current_call is None:
            # an idle session holds no timer, but for the memory watchdog
            return time.monotonic() + IDLE_SESSION_TICK if self.watch_memory and self.alive else None
        if self.interrupted_at is not None:
            return self.interrupted_at + self.current_call["grace"]
        due = self.deadline()
        if not self.demoted:
            return min(due, self.stage_started + _demote_after)
        return min(due, time.monotonic() + TICK)

    # -- events ----------------------------------------------------------------------------------
    def on_event(self, zygote, fd):
        if fd == self.pidfd:
            zygote.unwatch(fd)
            self._exited(zygote)
            return
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            zygote.unwatch(fd)
            self.open_fds.discard(fd)
            os.close(fd)
            return
        if fd == self.meta_r:
            self._take_meta(zygote, chunk)
            return
        self._keep(fd, chunk)

    def _keep(self, fd, chunk):
        buf = self.buffers[fd]
        room = self.limits["output_limit"] - len(buf)
        if room > 0:
            buf += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def _take_meta(self, zygote, chunk):
        """fd 3, capped as it arrives and scanned once (a record without a newline costs nothing more)."""
        self.meta_bytes += len(chunk)
        if self.meta_bytes > self.meta_budget:
            if not self.overflowed:
                self.overflowed = True
                self.meta = bytearray()
                self.meta_scanned = 0
                self.kill(zygote, f"its records to the server passed {self.meta_budget} bytes")
            return
        self.meta += chunk
        start = 0
        while True:
            end = self.meta.find(b"\n", self.meta_scanned)
            if end < 0:
                self.meta_scanned = len(self.meta)
                break
            self._take_record(zygote, bytes(self.meta[start:end]))
            start = self.meta_scanned = end + 1
        if start:
            del self.meta[:start]
            self.meta_scanned -= start

    def _take_record(self, zygote, line):
        try:
            record = _loads(line.decode("utf-8", "replace"))
        except ValueError:
            return  # the run may write garbage into its inherited fd 3; it only hurts itself
        if not isinstance(record, dict):
            return
        kind = record.get("kind")
        if kind == "compiled" and self.head.get("exec") and self.compile_result is None:
            self.compile_result = self._stage_result("Finished", record)
            self.compile_result["stdout"] = record.get("stdout", "")
            self.compile_result["stderr"] = record.get("stderr", "")
            self._begin_stage(self.limits["timeout"], fresh_output=False)  # the program may have written already
        elif kind == "call_done" and self.current_call is not None:
            self._finish_call(zygote, record)
        elif kind == "session_ready" and self.session is not None and self.current_call is None:
            group = self.groups["memory"][1] if "memory" in self.groups else None
            zygote._reply({"id": self.id, "status": "Finished", "session_alive": True, "group": group})
        elif kind in ("cell", "done"):
            self.records.append(record)

    def on_time(self, zygote, now):
        if self.killed_at is not None:
            if not self.exited and now >= self.killed_at + KILL_WAIT:
                self._answer_without_exit(zygote)
            return
        if self.watch_memory and self.alive and self._over_memory(now):
            self.memory_killed = True
            self.kill(zygote, "killed for exceeding its memory limit")
            return
        if self.session is not None and self.current_call is None:
            return
        if self.interrupted_at is not None:
            if now >= self.interrupted_at + self.current_call["grace"]:
                self.kill(zygote, f"killed: the call ignored the interrupt at its time-out for "
                                  f"{self.current_call['grace']:g} s")
            return
        if not self.demoted and now >= self.stage_started + _demote_after:
            self.demoted = True
        if self.demoted:
            self._sample(zygote)
        if now >= self.deadline():
            self.timed_out = True
            # Starved: cut off by the client's deadline before it had its own time-out of running time.
            self.starved = self.hard_deadline < self.stage_started + self.stage_timeout + self.wait_seen
            if self.session is not None:
                self.interrupted_at = now
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGINT)  # as a Jupyter kernel's interrupt
            else:
                self.kill(zygote, "timed out")  # answered once the kernel has ended it

    def _sample(self, zygote):
        """CPU time used and time spent waiting for a CPU, over the run's processes; each of them
        (setsid or not, every thread) goes to the lowest CPU priority: fresh runs get the CPU first."""
        cpu, wait = _demote_tree(self.pid)
        if self.wait_base is None:
            self.wait_base = (cpu, wait) if self.session is not None else (0.0, 0.0)
        self.cpu_seen = cpu - self.wait_base[0]
        self.wait_seen = max(self.wait_seen, wait - self.wait_base[1])

    def _over_memory(self, now):
        """Sampled at most once a tick (on_time runs after every event of the zygote)."""
        if now - self.memory_checked < TICK / 2:
            return False
        self.memory_checked = now
        return _tree_memory(self.pid) > self.limits["memory"]

    # -- endings ---------------------------------------------------------------------------------
    def kill(self, zygote, reason):
        self.end_reason = self.end_reason or reason
        self.alive = False
        if self.killed_at is None and not self.exited:
            self.killed_at = time.monotonic()
        _kill(self.pid, zygote.isolated)

    def _exited(self, zygote):
        """PID 1 is gone, and with it (its PID namespace ended) every process of the run: collect it,
        take what is left in the pipes (no writer is left), then answer."""
        if self.exited:
            return
        self.exited = True
        if not zygote.isolated:
            _kill(self.pid, False)  # no PID namespace: take the whole process group down
        _, self.status, usage = os.wait4(self.pid, 0)
        self.collected = True
        self.cpu_used = usage.ru_utime + usage.ru_stime
        self._drain(zygote)
        if self.session is not None:
            self._session_died(zygote)
        else:
            self._finish(zygote)

    def _answer_without_exit(self, zygote):
        """The kernel has not ended a killed run in KILL_WAIT: answer (the client's deadline is
        near) and collect it when it goes."""
        self.end_reason = f"{self.end_reason}; its processes were still exiting {KILL_WAIT:g} s after SIGKILL"
        self.status = signal.SIGKILL  # a wait status: killed by SIGKILL
        if self.session is not None:
            self._session_died(zygote)
        else:
            self._finish(zygote)

    def _finish(self, zygote):
        if self.id not in zygote.runs:
            return
        done = next((r for r in reversed(self.records) if r.get("kind") == "done"), None)
        code = os.waitstatus_to_exitcode(self.status) if self.collected or self.killed_at else None
        if self.head.get("exec") and done is not None and not self.timed_out:
            code = done.get("return_code")  # the program's own status, signals included
        if self.timed_out:
            code = -signal.SIGKILL
        reply = self._stage_result("TimeLimitExceeded" if self.timed_out else "Finished",
                                   {"return_code": code, "cpu_time": self.cpu_used if self.collected else None})
        reply["id"] = self.id
        reply["truncated"] = self.dropped > 0 or self.overflowed or bool(
            self.compile_result and self.compile_result.get("truncated"))
        if self.compile_result is not None:
            reply["compile"] = self.compile_result
        if done is not None and "files" in done:
            reply["files"] = done["files"]
        cells = [r for r in self.records if r.get("kind") == "cell"]
        if cells:
            reply["cells"] = cells
            reply["truncated"] = reply["truncated"] or any(cell.get("truncated") is True for cell in cells)
        if self.end_reason == "cancelled":
            reply["error"] = "cancelled"
        self._note_memory(zygote, reply)
        zygote._reply(reply)
        zygote.retire(self)

    def _note_memory(self, zygote, reply):
        scope = "own" if self.memory_killed else _memory_kill(self.groups, zygote.cfg["cgroup_v2"])
        self.memory_exceeded = scope is not None
        if scope is not None:
            self.end_reason = MEMORY_KILLS[scope]
            reply["memory_exceeded"] = True
            reply["memory_scope"] = scope

    def _stage_result(self, status, record):
        now = time.monotonic()
        elapsed = now - self.stage_started
        result = {"status": status, "return_code": record.get("return_code"), "execution_time": elapsed,
                  "cpu_time": record.get("cpu_time")}
        if self.demoted:
            result["cpu_wait_time"] = self.wait_seen
            if result["cpu_time"] is None:
                result["cpu_time"] = self.cpu_seen
        if status == "TimeLimitExceeded":
            result["cpu_starved"] = self.starved
        out = self.buffers[self.out_r].decode("utf-8", "replace")
        err = self.buffers[self.err_r].decode("utf-8", "replace")
        if self.dropped:
            marker = TRUNCATION_MARKER.format(dropped=self.dropped)
            if len(self.buffers[self.out_r]) >= self.limits["output_limit"]:
                out += marker
            if len(self.buffers[self.err_r]) >= self.limits["output_limit"]:
                err += marker
        if self.overflowed:
            err += f"\n[verl-sf: killed: {self.end_reason}]\n"
        result["stdout"], result["stderr"] = out, err
        return result

    def _drain(self, zygote):
        """Output already in the pipes is this run's (or this call's): take it without waiting."""
        for fd in (self.out_r, self.err_r, self.meta_r):
            while fd in self.open_fds and select.select([fd], [], [], 0)[0]:
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    zygote.unwatch(fd)
                    self.open_fds.discard(fd)
                    os.close(fd)
                elif fd == self.meta_r:
                    self._take_meta(zygote, chunk)
                else:
                    self._keep(fd, chunk)

    # -- sessions --------------------------------------------------------------------------------
    def call(self, zygote, head, body):
        if self.current_call is not None:
            zygote._reply({"id": head["id"], "status": "Error", "session_alive": True,
                           "error": "the session is busy with another call"})
            return
        self._drain(zygote)  # output of background work between calls is not this call's
        self.current_call = head
        self.call_id = head["id"]
        self.limits = head["limits"]
        self.records = []
        self.meta_bytes = 0
        self.hard_deadline = time.monotonic() + self.limits["hard_timeout"]
        self._begin_stage(self.limits["timeout"])
        self.interrupted_at = None
        # A session once demoted stays at the lowest priority (raising it back takes CAP_SYS_NICE on the
        # host): as in a multi-level feedback queue, a job that has run long stays low.
        _set_cgroup_limits(self.groups, zygote.cfg["cgroup_v2"], self.limits, memory=False)
        try:
            # bash reads NUL-terminated fields (see BASH_SESSION); the python session reads the JSON line itself.
            _write_all(self.job_w, self._bash_call(_loads(body.decode()), zygote.cfg["fetch_limit"])
                       if self.session == "bash" else body + b"\n")
        except OSError:
            self.kill(zygote, "the session's interpreter is gone")

    def _bash_call(self, call, fetch_limit):
        self.fetch_paths = [p for p in call.get("fetch_files") or () if p and "\0" not in p]
        fields = [call["code"], str(fetch_limit), *self.fetch_paths, ""]
        return b"".join(field.encode("utf-8", "surrogateescape") + b"\0" for field in fields)

    def _finish_call(self, zygote, record):
        self._drain(zygote)
        status = "TimeLimitExceeded" if self.timed_out else "Finished"
        reply = self._stage_result(status, record)
        reply["id"] = self.call_id
        reply["truncated"] = self.dropped > 0
        reply["session_alive"] = True
        if "files" in record:
            reply["files"] = record["files"]
        elif "fetched" in record:  # a bash session's files, in the order they were asked for
            fetched = zip(self.fetch_paths, record["fetched"], strict=False)
            reply["files"] = {path: data for path, data in fetched if data is not None}
        if self.records:
            reply["cells"] = [r for r in self.records if r.get("kind") == "cell"]
            reply["truncated"] = self.dropped > 0 or any(cell.get("truncated") is True for cell in reply["cells"])
        self.current_call = None
        self.interrupted_at = None
        # What a call left running in the background drops to the lowest CPU priority.
        if _has_children(self.pid):
            _demote_tree(self.pid)
        zygote._reply(reply)

    def _session_died(self, zygote):
        if self.id not in zygote.sessions:
            return
        self.alive = False
        ended = {}
        self._note_memory(zygote, ended)
        reason = self.end_reason or "its interpreter exited"
        if self.current_call is not None:
            reply = self._stage_result("TimeLimitExceeded" if self.timed_out else "Finished", {"return_code": None})
            reply.update(ended, id=self.call_id, session_alive=False, session_end=reason)
            zygote._reply(reply)
            self.current_call = None
        zygote._reply({"id": self.id, "status": "Finished", "session_alive": False, "session_end": reason})
        if self.job_w >= 0:
            os.close(self.job_w)
            self.job_w = -1
        zygote.retire(self)


MEMORY_KILLS = {
    "own": "killed for exceeding its memory limit",
    "shared": "killed for memory: the runs and sessions of this server together reached its memory cap "
              "(--runs-memory-mb), not this one's own limit",
}


_demote_after = 0.1


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return  # the child died before its job: reported when its PID 1 is collected


def _kill(pid, isolated):
    try:
        if isolated:
            os.kill(pid, signal.SIGKILL)  # PID 1 of its namespace: the kernel kills the rest
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_limits_set: dict[tuple, str] = {}  # (group, file) -> the value last written: a pooled group keeps it for the next run


def _set_cgroup_limits(groups, v2, limits, memory=True):
    if memory and limits["memory"] and "memory" in groups:
        _write_limit(groups["memory"], "memory.max" if v2 else "memory.limit_in_bytes", str(limits["memory"]))
    if "pids" in groups:
        _write_limit(groups["pids"], "pids.max", str(limits["nproc"] + 8))


def _write_limit(group, name, value):
    if _limits_set.get((group, name)) != value:
        _write_group(group, name, value)
        _limits_set[(group, name)] = value


def _memory_kill(groups, v2):
    """Whose cap the kernel killed a process of this group for: "own" (the group reached its
    limit), "shared" (the cap over all runs and sessions was reached first), or None (no kill;
    pooled groups start at zero)."""
    if "memory" not in groups:
        return None
    base, name = groups["memory"]
    counters = _read_counters(base, f"{name}/{'memory.events' if v2 else 'memory.oom_control'}")
    if counters.get(b"oom_kill", 0) == 0:
        return None
    if v2:
        hit_own_limit = counters.get(b"max", 0) > 0
    else:
        hit_own_limit = _read_counters(base, f"{name}/memory.failcnt", b"failcnt").get(b"failcnt", 0) > 0
    return "own" if hit_own_limit else "shared"


def _read_counters(base, path, single=None):
    """`key value` lines of a cgroup file (or its one number, named `single`); {} if unreadable."""
    try:
        with open(path, "rb", opener=_opener(base)) as fh:
            text = fh.read()
    except OSError:
        return {}
    if single is not None:
        return {single: int(text or b"0")}
    counters = {}
    for line in text.splitlines():
        key, _, value = line.partition(b" ")
        with contextlib.suppress(ValueError):
            counters[key] = int(value)
    return counters


def _opener(base):
    return lambda path, flags: os.open(path, flags | os.O_CLOEXEC, dir_fd=base)


def _write_group(group, name, text):
    """Write a file of a run's cgroup, through the delegated directory's descriptor."""
    base, directory = group
    _write_text(f"{directory}/{name}", text, base)


def _write_text(path, text, base=None):
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=base)
    try:
        os.write(fd, text.encode())
    except OSError:
        pass  # a controller the host does not offer: the cap falls back to rlimits
    finally:
        os.close(fd)


def _tree(pid, limit=1024):
    """`pid` and its descendants (children of every thread), as the zygote's /proc shows them."""
    stack = [pid]
    seen = 0
    while stack and seen < limit:
        current = stack.pop()
        seen += 1
        yield current
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", "rb") as fh:
                    stack.extend(int(child) for child in fh.read().split())
        except (OSError, ValueError):
            continue


def _demote_tree(pid):
    """Every thread of `pid` and its descendants to nice 19 (nice is per thread, and a setsid'd
    process is out of the run's process group); returns (seconds on a CPU, seconds waiting for
    one) summed over them."""
    cpu = wait = 0.0
    for current in _tree(pid, 256):
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(task), 19)
        try:
            with open(f"/proc/{current}/schedstat", "rb") as fh:
                fields = fh.read().split()
            cpu += int(fields[0]) / 1e9
            wait += int(fields[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return cpu, wait


def _has_children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as fh:
            return bool(fh.read().strip())
    except OSError:
        return False


def _tree_memory(pid):
    """Bytes of anonymous and shared memory the run's processes hold, each page split between the
    processes that map it (PSS), so pages still shared with the warm interpreter barely count;
    plus the memfds they hold open, mapped or not (a mapped one counts twice: the cap errs low)."""
    total = 0
    memfds = {}
    for current in _tree(pid):
        try:
            with open(f"/proc/{current}/smaps_rollup", "rb") as fh:
                for line in fh.read().splitlines():
                    if line.startswith((b"Pss_Anon:", b"Pss_Shmem:")):
                        total += int(line.split()[1]) << 10
            for fd in os.listdir(f"/proc/{current}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{current}/fd/{fd}").startswith("/memfd:"):
                        info = os.stat(f"/proc/{current}/fd/{fd}")
                        memfds[(info.st_dev, info.st_ino)] = info.st_blocks * 512
        except (OSError, ValueError, IndexError):
            continue
    return total + sum(memfds.values())


# ---- inside the child (user code starts here) -------------------------------------------------
class Child:
    """Set-up of one forked child, then its job: a run, or a session's calls."""

    def __init__(self, zygote, groups):
        self.cfg = zygote.cfg
        self.isolated = zygote.isolated
        self.seccomp = zygote.seccomp
        self.mounts = zygote.mounts
        self.comm = zygote.comm
        self.cwd = zygote.cwd
        self.groups = groups
        self.workdir = self.cfg["workdir"]

    def setup(self, job_r, out_w, err_w, meta_w):
        _libc.prctl(PR_SET_NAME, READY_NAME, 0, 0, 0)
        if self.isolated:
            self._mounts()
        else:
            self.workdir = f"{self.cfg['workdir']}/run-{os.getpid()}"
            os.makedirs(self.workdir + "/.tmp", exist_ok=True)
            os.environ["TMPDIR"] = self.workdir + "/.tmp"
            os.environ["HOME"] = self.workdir
        for group in set(self.groups.values()):
            _write_group(group, "cgroup.procs", "0")
        os.setsid()
        # Everything that does not depend on the job is done while waiting for it, off the
        # request's path: the job pipe sits on fd 9 until the job is read.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (job_r, out_w, err_w, meta_w)]  # above every target
        for fd, target in zip(moved, (9, 1, 2, 3), strict=True):
            os.dup2(fd, target)
        os.closerange(4, 9)
        os.closerange(10, 1 << 16)
        oom = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(oom, b"1000")  # under memory pressure the run dies, never the warm interpreter
        os.close(oom)
        os.chdir(self.workdir)
        stdin_fd = os.memfd_create("stdin", 0)
        if self.isolated:
            self._drop_privileges()
        namespace = _main_namespace(self.cwd if self.isolated else self.workdir)
        job = _read_job()
        _libc.prctl(PR_SET_NAME, self.comm, 0, 0, 0)
        _write_files(job.get("files") or {}, self._roots())
        self._limit(job)
        mode = job.get("mode")
        if mode == "session_python":
            os.close(stdin_fd)
            _report({"kind": "session_ready"})
            _python_session(namespace, self)
        if mode == "session_bash":
            os.close(stdin_fd)
            _report({"kind": "session_ready"})
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.execve("/bin/bash", ["bash", "--noprofile", "--norc", "-c", BASH_SESSION], dict(os.environ))
        os.write(stdin_fd, (job.get("stdin") or "").encode("utf-8", "surrogateescape"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        os.close(9)
        if mode == "exec":
            code = self._exec_stages(job)
        elif mode == "jupyter":
            code = _run_cells(job["cells"], job.get("cell_timeout") or 0, job["output_limit"], namespace)
        else:
            code = _run_python(job["code"], namespace)
        _report_done(code, job.get("fetch_files"), self)
        os._exit(code & 0xFF)

    def _mounts(self):
        """The run's own view: every mount of the sandbox read-only (nothing one run plants there
        reaches another), then fresh writable tmpfs, /proc, /dev/shm, /dev/pts and a network of
        its own whose loopback only it can reach."""
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET), "unshare(CLONE_NEWNS)")
        _read_only_tree()
        _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        for encoded, options, target, keep in self.mounts:
            kept = [os.open(f"{target}/{entry}", os.O_PATH | os.O_CLOEXEC) for entry in keep]
            _check(_libc.mount(b"tmpfs", encoded, b"tmpfs", MS_NOSUID | MS_NODEV, options), f"mount {target}")
            # A runtime that lives under /tmp (a CI checkout, say) is bound back on top.
            for entry, fd in zip(keep, kept, strict=True):
                os.mkdir(f"{target}/{entry}", 0o711)
                _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), f"{target}/{entry}".encode(), None,
                                   MS_BIND | MS_REC, None), f"bind {entry}")
                os.close(fd)
        owner = 0 if self.cfg["single_uid"] else self.cfg["uid"]
        for directory in self.cfg["premade"]:
            os.mkdir(directory, 0o755)
            os.chown(directory, owner, owner)
        # POSIX shared memory and semaphores (multiprocessing's locks) live here: private to the run too.
        shm_options = f"size={self.cfg['sizes'][self.cfg['tmpdir']]},mode=1777".encode()
        _check(_libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, shm_options), "mount /dev/shm")
        _check(_libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC,
                           b"newinstance,ptmxmode=0666,mode=0620"), "mount /dev/pts")
        _loopback_up()

    def _drop_privileges(self):
        """The uid change clears the effective and permitted capabilities (an unmapped single
        uid keeps uid 0 of the namespace, so they are cleared by hand); then no_new_privs and the
        seccomp filter, which an exec keeps."""
        if self.cfg["single_uid"]:  # its namespace denies setgroups (and it has no groups to drop)
            _set_capabilities(keep_effective=False)
        else:
            os.setgroups([])
            os.setresgid(self.cfg["gid"], self.cfg["gid"], self.cfg["gid"])
            os.setresuid(self.cfg["uid"], self.cfg["uid"], self.cfg["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if self.seccomp:
            _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self.seccomp, 0, 0), "seccomp")

    def _limit(self, job):
        limits = {
            resource.RLIMIT_FSIZE: job["fsize"],
            resource.RLIMIT_NOFILE: job["nofile"],
            resource.RLIMIT_CORE: 0,
        }
        if not self.groups:
            limits[resource.RLIMIT_NPROC] = job["nproc"]  # per uid, so shared: only when no pids cgroup
            if job.get("memory"):
                limits[resource.RLIMIT_DATA] = job["memory"]  # the best cap without a memory cgroup
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))

    def _exec_stages(self, job):
        """The compile stage, if any, with its output captured apart; then the program.  This PID 1
        runs no user code and is made undumpable: the program cannot open its fd 3 through /proc
        nor trace it, so the records it writes are the verdict."""
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
        if job.get("compile_argv"):
            captures = [os.memfd_create("compile-stdout"), os.memfd_create("compile-stderr")]
            start = os.times()
            code = _exec_as_child(job["compile_argv"], captures)
            used = os.times()
            texts = [_read_capped(fd, job["output_limit"]) for fd in captures]
            cpu = (used.children_user + used.children_system) - (start.children_user + start.children_system)
            _report({"kind": "compiled", "return_code": code, "cpu_time": cpu, "stdout": texts[0], "stderr": texts[1]})
            if code != 0:
                return code
        return _exec_as_child(job["argv"], None)

    def fetch(self, paths):
        """The requested files, read as the run's user, never through a symlink or out of its dirs.
        A file named twice (`big`, `./big`, `/workdir/big`) is read once, under its first name; all
        files together stay within the fetch limit."""
        fetched = {}
        seen = set()
        room = self.cfg["fetch_limit"]
        for path in paths or ():
            try:
                fd = _open_beneath(path, os.O_RDONLY, self._roots())
            except (OSError, ValueError):
                continue  # Sandbox Fusion leaves missing files out of the answer
            with os.fdopen(fd, "rb") as fh:
                info = os.fstat(fh.fileno())
                if (info.st_dev, info.st_ino) in seen or info.st_size > room:
                    continue
                seen.add((info.st_dev, info.st_ino))
                data = fh.read(room + 1)
            if len(data) <= room:
                fetched[path] = base64.b64encode(data).decode()
                room -= len(data)
        return fetched

    def _roots(self):
        return _roots(self.cfg, self.workdir, self.isolated)


def _read_only_tree():
    """Every mount of this (new) mount namespace read-only: one mount_setattr, or a remount per
    mount point where the kernel predates it (device nodes such as /dev/null stay writable)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    if _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
        return
    if ctypes.get_errno() != errno.ENOSYS:
        _check(-1, "mount_setattr(/, MOUNT_ATTR_RDONLY)")
    with open("/proc/self/mountinfo") as info:
        mounts = [line.split() for line in info]
    for fields in mounts:
        # The per-mount flags a remount must repeat (they may be locked from an outer namespace).
        kept = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                "relatime": MS_RELATIME, "nodiratime": MS_NODIRATIME}
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in fields[5].split(","):
            flags |= kept.get(option, 0)
        target = fields[4].replace("\\040", " ").encode()
        _check(_libc.mount(None, target, None, flags, None), f"remount {fields[4]} read-only")


def _loopback_up():
    """The run's network namespace starts with its loopback down: bring it up (SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def _roots(cfg, workdir, isolated):
    """The directories a run's files may be named in: absolute paths under these, relative ones in the first."""
    if not isolated:
        return [workdir]
    return [cfg["workdir"], cfg["tmpdir"], cfg["datadir"]]


def _split_path(path, roots):
    """(root, relative path beneath it) for a request's path, or ValueError."""
    if path.startswith("/"):
        for root in roots:
            if path == root or path.startswith(root.rstrip("/") + "/"):
                rest = path[len(root):].lstrip("/")
                break
        else:
            raise ValueError(f"path {path!r} is outside the run's directories")
        base = root
    else:
        base, rest = roots[0], path
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or "\x00" in path:
        raise ValueError(f"path {path!r} must name a file beneath {base} without '..'")
    return base, parts


def _open_beneath(path, flags, roots, mode=0o644):
    """open(2) of `path` strictly beneath its root, no symlink followed at any component:
    openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a walk one O_NOFOLLOW component at a
    time where the kernel lacks openat2."""
    base, parts = _split_path(path, roots)
    root = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        how = _OpenHow(flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode if flags & os.O_CREAT else 0,
                       RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        fd = _libc.syscall(SYS_OPENAT2, root, "/".join(parts).encode(), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err), path)
        directory = os.dup(root)
        for part in parts[:-1]:
            try:
                following = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            finally:
                os.close(directory)
            directory = following
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
        finally:
            os.close(directory)
    finally:
        os.close(root)


def _write_files(files, roots):
    """The request's files, written by the run itself (as its user) before its code starts.
    A file that cannot be written ends the run, as a failed `cp` would end a job script."""
    for path, content in files.items():
        try:
            base, parts = _split_path(path, roots)
            directory = base
            for part in parts[:-1]:
                directory = f"{directory}/{part}"
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory)
            fd = _open_beneath(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, roots)
            with os.fdopen(fd, "wb") as fh:
                fh.write(base64.b64decode(content or ""))
        except (OSError, ValueError) as exc:
            os.write(2, f"verl-sf: could not write file {path!r}: {exc}\n".encode())
            _report_done(1, None, None)
            os._exit(1)




def _read_job():
    """The job from fd 9: one line.  An empty pipe means the zygote is gone or shutting down."""
    chunks = []
    while True:
        chunk = os.read(9, READ_CHUNK)
        if not chunk:
            os._exit(0)
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    return _loads(b"".join(chunks).decode())


def _exec_as_child(argv, captures):
    """Run a program below us, so it is not PID 1: the kernel shields PID 1 from its own
    signals, which would turn abort() into a crash and ignore `kill $$`."""
    pid = os.fork()
    if pid == 0:
        try:
            os.close(3)
            if captures:
                os.dup2(captures[0], 1)
                os.dup2(captures[1], 2)
            # Python ignores SIGPIPE; a program gets the default a shell would give it, so `yes | head` ends.
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execve(argv[0], argv, dict(os.environ))
        except BaseException as exc:
            os.write(2, f"verl-sf: cannot execute {argv[0]}: {exc}\n".encode())
        os._exit(127)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _read_capped(fd, limit):
    size = os.fstat(fd).st_size
    text = os.pread(fd, limit, 0).decode("utf-8", "replace")
    if size > limit:
        text += TRUNCATION_MARKER.format(dropped=size - limit)
    os.close(fd)
    return text


def _report(record):
    os.write(3, _dumps(record) + b"\n")


def _report_done(code, fetch_files, child):
    """Close our stdio, then tell the zygote the run is over, how it ended, and its files.

    The zygote answers the server right away instead of waiting for the kernel to tear down
    this process and its namespaces; it reaps us after answering.
    """
    times = os.times()
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    record = {"kind": "done", "return_code": code,
              "cpu_time": times.user + times.system + times.children_user + times.children_system}
    if fetch_files is not None and child is not None:
        record["files"] = child.fetch(fetch_files)
    _report(record)
    os.close(3)


def _python_session(namespace, child):
    """A live interpreter: each call is one line of JSON on fd 9, run in the same globals."""
    source = os.fdopen(9, "rb", buffering=0)
    pending = b""
    while True:
        try:
            while b"\n" not in pending:
                chunk = source.read(READ_CHUNK)
                if not chunk:
                    os._exit(0)
                pending += chunk
            line, _, pending = pending.partition(b"\n")
            call = _loads(line.decode())
            started = os.times()
            stdin_fd = os.memfd_create("stdin", 0)
            os.write(stdin_fd, (call.get("stdin") or "").encode("utf-8", "surrogateescape"))
            os.lseek(stdin_fd, 0, os.SEEK_SET)
            os.dup2(stdin_fd, 0)
            os.close(stdin_fd)
            if call.get("cells") is not None:
                code = _run_cells(call["cells"], call.get("cell_timeout") or 0, call["output_limit"], namespace,
                                  finish=False)
            else:
                code = _run_python(call["code"], namespace, finish=False)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            used = os.times()
            record = {"kind": "call_done", "return_code": code,
                      "cpu_time": (used.user + used.system) - (started.user + started.system)}
            if call.get("fetch_files") is not None:
                record["files"] = child.fetch(call["fetch_files"])
            _report(record)
        except KeyboardInterrupt:
            _report({"kind": "call_done", "return_code": 1})  # the interrupt came between statements of ours


# ---- helpers shared by zygote and child -------------------------------------------------------
@contextlib.contextmanager
def _threading_stand_in():
    """While the libraries load, `threading` is a module that hands out the `_thread` lock
    types `threading` itself hands out (numpy.random only takes `Lock` and `RLock` from it).

    The real module registers a fork hook that rebuilds its thread state in every forked run,
    used or not.  Any other name read from the stand-in imports the real module then and
    forwards to it, so a library that needs more still gets it (and the hook).  The stand-in
    leaves `sys.modules` afterwards: a run that imports `threading` gets the real module."""
    if "threading" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("threading", "verl-sf's stand-in while libraries load (see zygote.py)")
    stand_in.Lock = getattr(_thread, "lock", _thread.allocate_lock)
    stand_in.RLock = _thread.RLock
    stand_in.__getattr__ = _real_threading_attribute
    sys.modules["threading"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("threading") is stand_in:
            del sys.modules["threading"]


def _real_threading_attribute(name):
    """Put the real `threading` in the stand-in's place and read `name` from it (dunder names,
    which tools probe on every module, are answered as missing instead)."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if getattr(sys.modules.get("threading"), "__getattr__", None) is _real_threading_attribute:
        del sys.modules["threading"]
    import threading
    return getattr(threading, name)


def _collapse_heap():
    """Back the imported heap with huge pages: fork then copies far fewer page-table entries."""
    huge = 1 << 21
    try:
        with open("/proc/self/maps") as maps:
            regions = [line.split() for line in maps]
    except OSError:
        return
    for parts in regions:
        path = parts[5] if len(parts) > 5 else ""
        if "w" not in parts[1] or "p" not in parts[1] or path not in ("", "[heap]"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        start = (start + huge - 1) & ~(huge - 1)
        end &= ~(huge - 1)
        if end > start:
            _libc.madvise(start, end - start, MADV_HUGEPAGE)
            _libc.madvise(start, end - start, MADV_COLLAPSE)


def _loads(text):
    """json.loads for one JSON value, strictly (nothing but whitespace around it)."""
    start = len(text) - len(text.lstrip())
    try:
        value, end = _scan_json(text, start)
    except StopIteration as exc:
        raise ValueError(f"expected a JSON value at {exc.value}") from None
    if text[end:].strip():
        raise ValueError(f"extra data after the JSON value at {end}")
    return value


def _dumps(value):
    """json.dumps(value).encode(), compact: the replies and records are plain dicts."""
    return "".join(_encode_json(value, 0)).encode()


def _reseed_generators():
    for name in RESEEDED_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.seed()


def _make_stdio():
    """Unbuffered text streams on fds 0-2: a killed run still shows its partial output."""
    return (io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace"),
            io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             write_through=True),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             write_through=True))


def _stdio_for_runs():
    """The streams of every python run, built once in the zygote.  They are built over what a
    run has on fds 0-2 (a memfd, then pipes), so they report the same seekability."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    stdin_fd = os.memfd_create("stdin", 0)
    out_r, out_w = os.pipe()
    for fd, target in ((stdin_fd, 0), (out_w, 1), (out_w, 2)):
        os.dup2(fd, target)
    try:
        return _make_stdio()
    finally:
        for fd, target in zip(saved, (0, 1, 2), strict=True):
            os.dup2(fd, target)
        for fd in (*saved, stdin_fd, out_r, out_w):
            os.close(fd)


def _install_stdio(streams):
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def _main_namespace(cwd):
    """As `python main.py` sets them up (the path joined by hand: os.path touches more pages)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    main.__dict__["__file__"] = cwd + "/main.py"
    sys.path[0:0] = [cwd]
    return main.__dict__


def _finish(code):
    try:
        threading = sys.modules.get("threading")
        if threading is not None:  # as at interpreter exit: only a run that imported it can have threads
            threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_python(code, namespace, finish=True):
    filename = namespace["__file__"]  # absolute, as `python main.py` shows it in tracebacks
    _cache_source(filename, code)
    done = _finish if finish else (lambda result: result)
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as exc:
        return done(_exit_code(exc))
    except BaseException as exc:
        sys.stderr.write("".join(_user_traceback(exc)))
        return done(1)
    return done(0)


def _cache_source(name, source):
    """The code's lines as linecache reads a file's: each ends with a newline, which the traceback's
    carets are placed by."""
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[name] = (len(source), None, lines, name)


def _user_traceback(exc):
    """The traceback as `python main.py` prints it, chained exceptions and CPython's "Did you mean"
    hints included (they need the frames), without the outer frames of this file (named "<string>")
    that ran the code."""
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    while report.stack and report.stack[0].filename == "<string>":
        del report.stack[0]
    lines = list(report.format())
    if isinstance(exc, (NameError, AttributeError)):
        own = next(report.format_exception_only())
        hinted = _hinted_line(exc, own)
        if hinted is not None and own in lines:
            lines[len(lines) - 1 - lines[::-1].index(own)] = hinted
    return lines


def _hinted_line(exc, own):
    """The exception's line with CPython's "Did you mean" hint, taken from CPython's own display:
    before 3.12 only that display computes it (the rest of its output is dropped: it reads source
    lines from disk, where a fast-path run has no main.py)."""
    shown, saved = io.StringIO(), sys.stderr
    sys.stderr = shown
    try:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    except Exception:
        return None
    finally:
        sys.stderr = saved
    prefix = own.rstrip("\n") + ". Did you mean"
    return next((line for line in reversed(shown.getvalue().splitlines(True)) if line.startswith(prefix)), None)


def _display_data(value):
    """A cell's result as Jupyter would show it: text/plain, plus image/png and text/html where
    the object offers them (a matplotlib figure, a pandas frame)."""
    data = {"text/plain": repr(value)}
    for method, mime in (("_repr_png_", "image/png"), ("_repr_html_", "text/html")):
        render = getattr(value, method, None)
        if callable(render):
            with contextlib.suppress(Exception):
                rendered = render()
                if isinstance(rendered, bytes):
                    rendered = base64.b64encode(rendered).decode()
                if rendered:
                    data[mime] = rendered
    return data


def _figures_display():
    """Open matplotlib figures, as inline PNGs (what a Jupyter kernel shows after a cell), then closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    shown = []
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        buffer = io.BytesIO()
        with contextlib.suppress(Exception):
            figure.savefig(buffer, format="png")
            shown.append({"image/png": base64.b64encode(buffer.getvalue()).decode(),
                          "text/plain": repr(figure)})
    pyplot.close("all")
    return shown


def _run_cells(cells, cell_timeout, output_limit, namespace, finish=True):
    """Cells share one namespace; each cell's output is captured apart and reported on fd 3.

    Every cell writes into a memfd standing in for fds 1 and 2 (so output of subprocesses is
    caught too); after the cell its content is read, capped, and the memfd is emptied.
    """
    saved = (os.dup(1), os.dup(2), sys.stdout, sys.stderr)
    captures = [os.memfd_create("cell-stdout"), os.memfd_create("cell-stderr")]
    os.dup2(captures[0], 1)
    os.dup2(captures[1], 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a flooding cell gets EFBIG, not death
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.stdout, sys.stderr = _make_stdio()[1:]  # over the memfds: seekable, unlike a python run's pipes

    def _alarm(signum, frame):
        raise TimeoutError(f"cell exceeded cell_timeout of {cell_timeout} s")

    signal.signal(signal.SIGALRM, _alarm)
    room = [output_limit, output_limit]  # what is left of each stream's limit, over all cells
    for index, source in enumerate(cells):
        name = f"<cell-{index}>"
        _cache_source(name, source)
        display, error = [], []
        if cell_timeout:
            signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            tree = ast.parse(source, name, "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
                if value is not None and not _is_figure_artist(value):
                    display.append(_display_data(value))
            display.extend(_figures_display())
        except BaseException as exc:  # noqa: B036 - a cell's SystemExit/KeyboardInterrupt is its own error
            error.append({"ename": type(exc).__name__, "evalue": str(exc), "traceback": _user_traceback(exc)})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        texts = []
        cut = False
        for which, (stream, fd) in enumerate(((sys.stdout, captures[0]), (sys.stderr, captures[1]))):
            with contextlib.suppress(Exception):
                stream.flush()
            size = os.fstat(fd).st_size
            data = os.pread(fd, room[which], 0)
            room[which] -= len(data)
            text = data.decode("utf-8", "replace")
            if size > len(data):
                text += TRUNCATION_MARKER.format(dropped=size - len(data))
                cut = True
            texts.append(text)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        _report({"kind": "cell", "stdout": texts[0], "stderr": texts[1], "display": display, "error": error,
                 "truncated": cut})
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (*captures, saved[0], saved[1]):
        os.close(fd)
    sys.stdout, sys.stderr = saved[2], saved[3]
    return _finish(0) if finish else 0


def _is_figure_artist(value):
    """A cell ending in a plotting call returns an artist; Jupyter shows the figure instead."""
    module = type(value).__module__ or ""
    if module.startswith("matplotlib"):
        return True
    return isinstance(value, list) and bool(value) and (type(value[0]).__module__ or "").startswith("matplotlib")


if __name__ == "__main__":
    _zygote_config = json.loads(sys.argv[1])
    _demote_after = _zygote_config["demote_after"]
    Zygote(_zygote_config).serve()
