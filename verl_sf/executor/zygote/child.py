"""One forked child: its isolation set up ahead of time, then its job (a run, or a session's calls).

In a fixed order, before it sees a job: its own mount, IPC and network namespaces (the PID one
is made by the zygote's fork), every inherited mount read-only, fresh tmpfs for its directories
and for /dev/shm, its own /proc and /dev/pts, its cgroups, a new session, stdio on fds 0-3, then
the run's uid, no capabilities, no_new_privs and the seccomp filter.  User code starts after that.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import signal
from collections.abc import Callable
from typing import NamedTuple, NoReturn, Optional

from . import exits, ipython_shell, landlock, linux, root
from .interactive import BASH_INIT, INIT_FD, JOB_FD, python_session
from .jupyter import run_cells
from .linux import CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_REC
from .messages import (
    PROCESS_LIMIT,
    TRUNCATION_MARKER,
    CompiledRecord,
    DoneRecord,
    RunBody,
    UnstartedRecord,
    ZygoteConfig,
)
from .paths import RUN_TMP, UnwritableFile, fetch, write_files
from .python_runner import main_namespace, run_python
from .run_groups import Groups, write
from .seccomp import Filter
from .wire import READ_CHUNK, SETUP_FAILED, SETUP_FAILED_TEXT, loads, report

OOM_SCORE_ADJ = 1000  # every process of a run or session, but a session's PID 1 (_become_init)
READY_NAME = b"verl-sf-ready"  # what `ps` shows for a child waiting for its job
WORKDIR = "/workdir"  # a run's directory as requests name it (models.RUN_DIRECTORIES)
SCRATCH_ENV = ("GOCACHE",)  # languages' scratch paths in /tmp (languages.GO_ENV): per run on every rung

# NamedTuples rather than dataclasses: `dataclasses` imports `inspect`, ~1 MB more heap that every
# fork copies the page-table entries of and every run's exit tears down.

class Mount(NamedTuple):
    """A per-child tmpfs: mount(2)'s target and options, and the entries bound back on top of it."""

    target: str
    options: bytes
    keep: list[str]


class Blueprint(NamedTuple):
    """What every child is made from, prepared once by the zygote."""

    cfg: ZygoteConfig
    seccomp: Filter
    mounts: list[Mount]
    comm: bytes  # a run's process name, as `python main.py` would show it
    cwd: str  # what os.getcwd() gives a run
    reseed: Callable[[], None]  # the generators libraries seeded at import, from OS entropy (warmup.reseeder)

    @property
    def tmpfs_targets(self) -> list[str]:
        """Where a run's or session's own tmpfs are mounted: its files."""
        return [mount.target for mount in self.mounts]

    @property
    def isolated(self) -> bool:
        return self.cfg["isolated"]

    @property
    def metadata_confined(self) -> bool:
        """The landlock rung with runs of our own uid: their metadata changes go through the zygote (metadata.py)."""
        return self.cfg["landlock"] is not None and not (self.cfg["run_uids"] or [0, 0])[1]


class Child:
    def __init__(self, blueprint: Blueprint, groups: Groups, sequence: int, network: int = -1, rooted: bool = False):
        self.blueprint = blueprint
        self.rooted = rooted  # a session whose commands may run as root: it gets a root helper (root.py)
        self.network = network  # an emptied network namespace of an earlier run to join, or -1: make one
        self.cfg = blueprint.cfg
        self.groups = groups
        self.job_fd = -1  # the job socket until user code runs: where a set-up failure is told (setup_failed)
        self.workdir = self.cfg["workdir"]
        first, count = self.cfg["run_uids"] or (0, 0)
        self.run_uid: Optional[int] = first + sequence % count if count else None  # the landlock rung as root

    def setup(self, job_r: int, out_w: int, err_w: int, meta_w: int) -> NoReturn:
        self.job_fd = job_r
        linux.set_name(READY_NAME)
        if self.blueprint.isolated:
            self._mounts()
        else:
            self.workdir = f"{self.cfg['workdir']}/run-{os.getpid()}"
            tmp = f"{self.workdir}/{RUN_TMP}"
            os.makedirs(tmp, exist_ok=True)
            if self.run_uid is not None:
                for directory in (self.workdir, tmp):
                    os.chown(directory, self.run_uid, self.run_uid)
            os.environ["TMPDIR"] = tmp
            os.environ["HOME"] = self.workdir
            for key in SCRATCH_ENV:  # under /tmp, which is the host's here
                if os.environ.get(key, "").startswith("/tmp/"):
                    os.environ[key] = os.environ["TMPDIR"] + os.environ[key][4:]
        for group in set(self.groups.values()):
            write(group, "cgroup.procs", "0")
        os.setsid()
        if not self.blueprint.isolated:
            linux.become_subreaper()  # without a PID namespace, what the run leaves behind stays below us
        # Everything that does not depend on the job is done while waiting for it, off the
        # request's path: the job pipe sits on fd 9 until the job is read.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (job_r, out_w, err_w, meta_w)]  # above every target
        for fd, target in zip(moved, (JOB_FD, 1, 2, 3), strict=True):
            os.dup2(fd, target)
        self.job_fd = JOB_FD
        os.closerange(4, JOB_FD)
        os.closerange(JOB_FD + 1, 1 << 16)
        oom = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(oom, b"%d" % OOM_SCORE_ADJ)  # under memory pressure the run dies, never the warm interpreter
        os.close(oom)
        os.chdir(self.workdir)
        stdin_fd = os.memfd_create("stdin", 0)
        if self.blueprint.isolated:
            if self.rooted:
                single = self.cfg["single_uid"]
                root.start(0 if single else self.cfg["uid"], 0 if single else self.cfg["gid"], self.blueprint.seccomp)
                linux.set_name(READY_NAME)
            self._drop_privileges()
        elif self.cfg["landlock"] is not None:
            self._restrict()
        namespace = main_namespace(self.blueprint.cwd if self.blueprint.isolated else self.workdir)
        # A rooted child only ever becomes a session's PID 1: its interpreter, forked from it, would fault
        # the pages a scratch cell wrote here all over again.
        if self.cfg["ipython"] and not self.rooted:
            ipython_shell.prepare(namespace)
        job = _read_job()
        linux.set_name(self.blueprint.comm)
        try:
            write_files(self._in_view(job.get("files") or {}), self._roots())
        except UnwritableFile as exc:  # as a failed `cp` ends a job script
            os.write(2, f"verl-sf: {exc}\n".encode())
            _report_done(1, None, [], 0)
            os._exit(1)
        self._limit(job)
        mode = job.get("mode")
        if mode in ("session_python", "session_bash"):
            self.job_fd = -1  # the session's own channel from here on
            _become_init()
        if mode == "session_python":
            os.close(stdin_fd)
            python_session(namespace, lambda paths: fetch(paths, self._roots(), self.cfg["fetch_limit"]))
        if mode == "session_bash":
            os.close(stdin_fd)
            os.dup2(JOB_FD, 0)
            init = os.memfd_create("bash-session", 0)
            os.write(init, BASH_INIT.encode())
            os.lseek(init, 0, os.SEEK_SET)
            os.dup2(init, INIT_FD)
            os.close(init)
            os.execve("/bin/bash", ["bash", "--noprofile", "--norc", "-s"],
                      {**os.environ, "BASH_ENV": f"/dev/fd/{INIT_FD}"})
        os.write(stdin_fd, (job.get("stdin") or "").encode("utf-8", "surrogateescape"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        if job.get("hold_exit"):  # PID 1 runs the code: its exit_group is the verdict, held for the zygote
            exits.hand_over(JOB_FD)
        os.close(JOB_FD)
        self.job_fd = -1
        children_cpu = None
        if mode == "exec":
            code, children_cpu = self._exec_stages(job)
        elif mode == "jupyter":
            code = run_cells(job["cells"], job.get("cell_timeout") or 0, job["output_limit"], namespace)
        else:
            code = run_python(job["code"], namespace)
        _report_done(code, job.get("fetch_files"), self._roots(), self.cfg["fetch_limit"], children_cpu)
        os._exit(code & 0xFF)

    def _mounts(self) -> None:
        """The run's own view: a copy of the zygote's, where every mount of the sandbox is read-only
        (nothing one run plants there reaches another), with fresh writable tmpfs, /proc, /dev/shm,
        /dev/pts and a network of its own whose loopback only it can reach."""
        linux.check(linux.libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(CLONE_NEWNS)")
        if self.network >= 0:
            linux.check(linux.libc.setns(self.network, CLONE_NEWNET), "setns(CLONE_NEWNET)")
        else:
            linux.check(linux.libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        linux.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        if self.network < 0:
            linux.new_network()
        for mount in self.blueprint.mounts:
            kept = [os.open(f"{mount.target}/{entry}", os.O_PATH | os.O_CLOEXEC) for entry in mount.keep]
            linux.mount(b"tmpfs", mount.target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, mount.options)
            # A runtime that lives under /tmp (a CI checkout, say) is bound back on top.
            for entry, fd in zip(mount.keep, kept, strict=True):
                os.mkdir(f"{mount.target}/{entry}", 0o711)
                linux.mount(f"/proc/self/fd/{fd}".encode(), f"{mount.target}/{entry}".encode(), None,
                            MS_BIND | MS_REC, None)
                os.close(fd)
        linux.bind_home_alias(self.cfg["home_alias"], self.cfg["workdir"])
        owner = 0 if self.cfg["single_uid"] else self.cfg["uid"]
        for directory in self.cfg["premade"]:
            os.mkdir(directory, 0o755)
            os.chown(directory, owner, owner)
        linux.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, b"newinstance,ptmxmode=0666,mode=0620")

    def _drop_privileges(self) -> None:
        """The uid change clears the effective and permitted capabilities (an unmapped single
        uid keeps uid 0 of the namespace, so they are cleared by hand); then no_new_privs and the
        seccomp filter, which an exec keeps."""
        if self.cfg["single_uid"]:  # its namespace denies setgroups (and it has no groups to drop)
            if not self.groups:  # no pids cgroup: RLIMIT_NPROC, made the run's own rather than its sandbox's
                linux.user_namespace(0, 0)
                linux.shrink_capabilities()  # the new namespace gave a full bounding set
            linux.set_capabilities(keep_effective=False)
        else:
            os.setgroups([])
            os.setresgid(self.cfg["gid"], self.cfg["gid"], self.cfg["gid"])
            os.setresuid(self.cfg["uid"], self.cfg["uid"], self.cfg["uid"])
        linux.no_new_privs()
        self.blueprint.seccomp.load()

    def _restrict(self) -> None:
        """The landlock rung, in nsjail's order: a uid of the run's own where we may change uids (which
        clears every capability), no_new_privs, the Landlock domain, then seccomp."""
        assert self.cfg["landlock"] is not None
        rules = landlock.ruleset(self.cfg["landlock"], self.workdir)
        if self.run_uid is not None:
            linux.shrink_capabilities()  # the bounding set empty for good, before the uid change clears the rest
            os.setgroups([])
            os.setresgid(self.run_uid, self.run_uid, self.run_uid)
            os.setresuid(self.run_uid, self.run_uid, self.run_uid)
        linux.no_new_privs()
        landlock.restrict(rules)
        self.blueprint.seccomp.load()

    def _limit(self, job: RunBody) -> None:
        limits = {
            resource.RLIMIT_FSIZE: job["fsize"],
            resource.RLIMIT_NOFILE: job["nofile"],
            resource.RLIMIT_CORE: 0,
        }
        if not self.groups and (self.blueprint.isolated or self.run_uid is not None):
            # Per uid: with no pids cgroup, and only where the uid is the run's (or its namespace's) alone.
            limits[resource.RLIMIT_NPROC] = job["nproc"]
        elif not self.groups and self.cfg["landlock"] is not None:
            # The uid is the server's: no fewer than `nproc` more than every thread of the machine now
            # (a bound on fork and thread bombs; the watchdog then counts the run's own processes).
            with open("/proc/loadavg") as loadavg:
                limits[resource.RLIMIT_NPROC] = int(loadavg.read().split()[3].split("/")[1]) + job["nproc"]
        if not self.groups and job.get("memory"):
            limits[resource.RLIMIT_DATA] = job["memory"]  # the best cap without a memory cgroup
        for which, value in limits.items():
            hard = resource.getrlimit(which)[1]  # the account's own may be lower: a run gets no more than it
            resource.setrlimit(which, (value, value) if hard == resource.RLIM_INFINITY else (min(value, hard),) * 2)

    def _exec_stages(self, job: RunBody) -> tuple[int, float]:
        """The compile stage, if any, with its output captured apart; then the program.  Returns the
        status and the CPU seconds of the last stage run.  This PID 1 runs no user code and is made undumpable: the
        program cannot open its fd 3 through /proc nor trace it, so the records it writes are the verdict."""
        linux.check(linux.libc.prctl(linux.PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
        compile_cpu = 0.0
        if job.get("compile_argv"):
            captures = [os.memfd_create("compile-stdout"), os.memfd_create("compile-stderr")]
            code, compile_cpu = _exec_as_child(job["compile_argv"], captures)
            (out, out_cut), (err, err_cut) = (_read_capped(fd, job["output_limit"]) for fd in captures)
            record: CompiledRecord = {"kind": "compiled", "return_code": code, "cpu_time": compile_cpu,
                                      "stdout": out, "stderr": err, "truncated": out_cut or err_cut}
            report(record)
            if code != 0:
                return code, compile_cpu
        return _exec_as_child(job["argv"], None)

    def _in_view(self, files: dict[str, str]) -> dict[str, str]:
        """Without a view of its own (the landlock rung) a run's one directory is what `/workdir` names."""
        if self.blueprint.isolated:
            return files
        return {path.removeprefix(WORKDIR + "/") if path.startswith(WORKDIR + "/") else path: content
                for path, content in files.items()}

    def _roots(self) -> list[str]:
        """The directories a run's files may be named in: absolute paths under these, relative ones in the first."""
        if not self.blueprint.isolated:
            return [self.workdir]
        return [self.cfg["workdir"], self.cfg["tmpdir"], self.cfg["datadir"]]


def _become_init() -> None:
    """A session's PID 1 runs no user code: it reaps, and lives while anything below it does (a
    fork of the session is a child of it), so a fork outlives its parent's interpreter.  Were the
    OOM killer to pick it, the kernel would end every process below it, its forks' among them: it
    goes back to the zygote's oom_score_adj (0), and the interpreter and all it starts keep 1000, so
    a full memory cgroup takes any of them first, however small.  It is not dumpable: the
    interpreter, of the same uid, cannot trace it; the interpreter is as dumpable as a run is (without
    a uid change, its watchdog of the same uid must read its memory).  The interpreter returns."""
    dumpable = linux.dumpable()
    linux.set_oom_score_adj(0, dumpable=False)  # before the interpreter exists: no code of the session's sees it
    try:
        pid = os.fork()
    except BlockingIOError:  # no user code has run: capacity, not a fault (session.py)
        _unstarted(PROCESS_LIMIT, 1)
    if pid == 0:
        linux.set_oom_score_adj(OOM_SCORE_ADJ, dumpable)
        os.setsid()  # its own process group: an interrupt goes to it and what it runs
        return
    os.closerange(0, 1 << 16)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue


def setup_failed(job_fd: int, error: BaseException) -> None:
    """Tell the zygote, on the job socket that no user code ever holds, that this child failed before any
    code of the run's: a sandbox failure, never the code's (`SETUP_FAILED`, then why)."""
    if job_fd >= 0:
        with contextlib.suppress(OSError):
            os.write(job_fd, SETUP_FAILED + f"{type(error).__name__}: {error}"[:SETUP_FAILED_TEXT].encode())


def _unstarted(error: str, status: int) -> NoReturn:
    """This PID 1 (which has run no user code) could not start what it was to run: it says why on fd 3."""
    record: UnstartedRecord = {"kind": "unstarted", "error": error}
    report(record)
    os._exit(status)


def _read_job() -> RunBody:
    """The job from fd 9: one line.  An empty pipe means the zygote is gone or shutting down."""
    chunks = []
    while True:
        chunk = os.read(JOB_FD, READ_CHUNK)
        if not chunk:
            os._exit(0)
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    job: RunBody = loads(b"".join(chunks).decode())
    return job


def _exec_as_child(argv: list[str], captures: Optional[list[int]]) -> tuple[int, float]:
    """Run a program below us, so it is not PID 1: the kernel shields PID 1 from its own
    signals, which would turn abort() into a crash and ignore `kill $$`.  Returns its status and
    the CPU seconds it and what it waited for used."""
    try:
        pid = os.fork()
    except BlockingIOError:  # the program never ran: not its failure, and never scored as one
        _unstarted(f"verl-sf: {os.path.basename(argv[0])} could not be started: {PROCESS_LIMIT}", 126)
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
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def _read_capped(fd: int, limit: int) -> tuple[str, bool]:
    """A capture's text within `limit` bytes, and whether it was cut."""
    size = os.fstat(fd).st_size
    text = os.pread(fd, limit, 0).decode("utf-8", "replace")
    if size > limit:
        text += TRUNCATION_MARKER.format(dropped=size - limit)
    os.close(fd)
    return text, size > limit


def _report_done(code: int, fetch_files: Optional[list[str]], roots: list[str], fetch_limit: int,
                 children_cpu: Optional[float] = None) -> None:
    """Close our stdio, then report the run's files (and, for an exec run, the program's status and
    CPU seconds: `children_cpu`)."""
    times = os.times()
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    cpu = (children_cpu if children_cpu is not None
           else times.user + times.system + times.children_user + times.children_system)
    record: DoneRecord = {"kind": "done", "return_code": code, "cpu_time": cpu}
    if fetch_files is not None:
        record["files"] = fetch(fetch_files, roots, fetch_limit)
    report(record)
    os.close(3)


