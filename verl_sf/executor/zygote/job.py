"""What runs and sessions share, seen from the zygote: a child, its output, its records, its clock.

A job's processes end with its PID 1 (its PID namespace ends with it), and the zygote learns so
from the kernel (a pidfd): replies about a job that ended leave only then, with the return code
and CPU time wait4 reports.  A fast-path run is answered earlier, as its PID 1 asks to exit
(exits.py): once every process of it is killed, none runs code again.  Records the child
writes on fd 3 carry only what belongs to the job itself (its fetched files, its cells), except
where PID 1 runs no user code (`exec` runs, whose PID 1 is not dumpable: nothing of the program
reaches it).  Every channel is capped as it arrives: output per stream, and fd 3 in all.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Collection, Iterable
from typing import Any, Optional, Protocol, Union

from . import procfs
from .messages import (
    DISPLAYS_LEFT_OUT,
    NOTE,
    TRUNCATION_MARKER,
    Limits,
    MemoryScope,
    Reply,
    RunHead,
    SessionOpenHead,
    StageResult,
    ZygoteConfig,
    kept_displays,
)
from .run_groups import DEMOTED, KILLED, Groups, RunGroups
from .socket_memory import SocketProbe
from .wire import READ_CHUNK, Lines, bulk_of, loads, readable_of

KILL_WAIT = 5.0  # seconds a killed job's PID 1 has to be gone before a reply leaves without it
DRAIN_READS = 3 * (1 << 20) // READ_CHUNK  # three pipes grown to Linux's largest by default (1 MiB each)
TICK = 0.2  # seconds between CPU-wait samples of long runs (and memory samples, without a memory cgroup)
FILES_ENTRIES = 50_000  # names in a job's directory on the landlock rung: each costs every count
COUNT_SHARE = 0.05  # of the zygote's time one job's files counts may take
MAX_DISPLAYS = 20_000  # display bundles a run (a session's call) sends the server: tens of ms of its parsing
HIDDEN_SAMPLES = 3  # memory samples in a row a process may hide from (a fork not yet at its exec is undumpable)
WAITS_READ = 32  # processes whose wait a sample reads, where a cgroup counts the job's CPU
# Past its output limit a stream is read once a pause (~30 MB/s): its bytes are dropped anyway, and four
# runs' floods drained at full speed between cpu groups froze a whole 2-core VM for up to 25 s (red team).
DRAIN_PAUSE = 0.002
MEMORY_KILLS: dict[MemoryScope, str] = {
    "own": "killed for exceeding its memory limit",
    "shared": "killed for memory: the runs and sessions of this server together reached its memory cap "
              "(--runs-memory-mb), not this one's own limit",
}


class Watcher(Protocol):
    """What the zygote's loop hands an event on a descriptor it watches (a job, or a fork in progress)."""

    def on_event(self, zygote: Any, fd: int) -> None: ...


class JobHost(Protocol):
    """What a job needs of the zygote that holds it (supervisor.Zygote)."""

    cfg: ZygoteConfig
    isolated: bool
    groups: RunGroups
    runs: dict[int, Any]
    sessions: dict[int, Any]

    def take_ready(self, rooted: bool = False) -> tuple[int, int, int, int, int, Groups]: ...
    def watch(self, watcher: Watcher, fds: Iterable[int]) -> None: ...
    def want_writable(self, job: Job, fd: int, wanted: bool) -> None: ...
    def unwatch(self, fd: int) -> None: ...
    def reply(self, reply: Reply) -> None: ...
    def retire(self, job: Job) -> None: ...
    def reap_orphans(self) -> None: ...


class Job:
    def __init__(self, zygote: JobHost, head: Union[RunHead, SessionOpenHead], body: bytes):
        self.id = head["id"]
        self.body = body
        self.limits: Limits = head["limits"]
        self.alive = True
        self.exited = False
        self.collected = False  # its PID 1 was waited for already
        self.adopted = False  # its PID 1 is not our child (a session's fork): nothing to wait for
        self.fork_inits: set[int] = set()  # PID 1s of its forks, below its own PID 1 but none of its work
        # A session whose commands may run as root (root.py).
        self.rooted = head["op"] == "open" and head.get("rooted", False)
        self.status = 0  # PID 1's wait status, once known
        self.cpu_used: Optional[float] = None  # CPU seconds of PID 1 and every process it waited for, once known
        self.listener = -1  # a fast-path run's exit listener (exits.py)
        self.memory_exceeded = False
        self.job_w = -1
        self.unsent = memoryview(b"")  # what of its job or call its socket has not taken yet (send)
        self.killed_at: Optional[float] = None
        self.open_fds: set[int] = set()
        self.throttled: dict[int, float] = {}  # output pipes past their limit, not watched until then (DRAIN_PAUSE)
        self.records: list[dict[str, Any]] = []
        self.displays = 0  # display bundles its records carried (a session's: this call's)
        self.meta = Lines()
        self.meta_bytes = 0  # bytes received on fd 3 for this run or call
        # What fd 3 may carry: cells' output (capped by the child), their displays and the fetched files.
        self.meta_budget = 4 * self.limits["output_limit"] + zygote.cfg["fetch_limit"] * 4 // 3 + (1 << 20)
        self.overflowed = False
        self.cap_exceeded = ""  # the cap the zygote ended the job for (records, processes, files)
        self.end_reason = ""
        self.failure = ""  # the zygote could not set the job up: answered as a sandbox error
        # Without a memory cgroup, RLIMIT_DATA caps each process alone (not shared mappings, not
        # a job's many processes): the zygote then sums the job's memory every tick and kills past the cap.
        self.watch_memory = bool(self.limits["memory"]) and not zygote.cfg["cgroups"]
        self.memory_killed = False
        self.memory_checked = 0.0
        self.hidden: dict[int, int] = {}  # its processes whose memory was hidden: in how many samples in a row
        self.sockets: Optional[tuple[int, Optional[SocketProbe]]] = None  # (network namespace inode, probe)
        # Without a pids cgroup or a uid of its own (RLIMIT_NPROC counts a uid's every process), the
        # zygote counts a job's processes every tick and ends it past its cap.
        own_uid = bool(zygote.cfg["run_uids"] and zygote.cfg["run_uids"][1])
        # Without a tmpfs of its own (the landlock rung), a run's directory has no size cap but this one.
        self.files_cap = zygote.cfg["sizes"].get(zygote.cfg["workdir"], 0) if zygote.cfg["landlock"] else 0
        self.files_dir = ""  # set at start: the run's own directory
        self.files_device = os.stat(zygote.cfg["workdir"]).st_dev if self.files_cap else 0  # where they are
        self.files_checked = 0.0
        self.files_cost = 0.0  # seconds its last count took
        self.watch_processes = not zygote.cfg["cgroups"] and not zygote.cfg["isolated"] and not own_uid
        self.processes_checked = 0.0
        self.demote_after = zygote.cfg["demote_after"]

    # -- start and stages ------------------------------------------------------------------------
    def start(self, zygote: JobHost) -> None:
        pid, out_r, err_r, meta_r, job_w, groups = zygote.take_ready(self.rooted)
        self.attach(zygote, pid, out_r, err_r, meta_r, job_w, groups)
        self.files_dir = f"{zygote.cfg['workdir']}/run-{pid}"
        self.hard_deadline = time.monotonic() + self.limits["hard_timeout"]  # for all stages: the client waits for all
        self.begin_stage(self.first_timeout())
        try:
            zygote.groups.set_limits(groups, self.limits)
        except OSError as exc:  # never run without the cap asked for: a sandbox error, not the code's
            self.failure = f"verl-sf: the job's cgroup limits could not be set: {exc}"
            self.kill(zygote, self.failure)
            return
        self.send(zygote, self.body + b"\n")
        self.body = b""  # a session lives long: its creation body is not kept

    def attach(self, zygote: JobHost, pid: int, out_r: int, err_r: int, meta_r: int, job_w: int,
               groups: Groups, pidfd: int = -1) -> None:
        """Take on a child: its pipes, its cgroups, and a pidfd that says when it is gone (opened here
        unless given)."""
        self.pid, self.out_r, self.err_r, self.meta_r, self.job_w = pid, out_r, err_r, meta_r, job_w
        os.set_blocking(job_w, False)  # send: a reader that stops reading holds up nothing of the zygote's
        self.groups: Groups = groups
        self.pidfd = pidfd if pidfd >= 0 else os.pidfd_open(pid)
        self.open_fds = {out_r, err_r, meta_r}  # blocking: read only when poll says there is something
        zygote.watch(self, (out_r, err_r, meta_r, self.pidfd))
        self.register(zygote)

    def register(self, zygote: JobHost) -> None:
        raise NotImplementedError

    def send(self, zygote: JobHost, data: bytes) -> None:
        """Its job or a call, to its socket without waiting: what its reader leaves unread (code that
        keeps a session's interpreter from its read) goes as it reads, so no job holds up the others."""
        self.unsent = memoryview(data)
        self.send_more(zygote)

    def send_more(self, zygote: JobHost) -> None:
        try:
            while self.unsent:
                self.unsent = self.unsent[os.write(self.job_w, self.unsent):]
        except BlockingIOError:
            pass
        except OSError:  # the reader is gone: whoever waits for it learns so from its exit
            self.unsent = memoryview(b"")
        zygote.want_writable(self, self.job_w, bool(self.unsent))

    def close_job_socket(self, zygote: JobHost) -> None:
        if self.job_w >= 0:
            zygote.want_writable(self, self.job_w, False)
            zygote.unwatch(self.job_w)
            os.close(self.job_w)
            self.job_w = -1
        self.unsent = memoryview(b"")

    def first_timeout(self) -> float:
        return self.limits["timeout"]

    def begin_stage(self, timeout: float, fresh_output: bool = True) -> None:
        now = time.monotonic()
        self.stage_started = now
        self.stage_timeout = timeout
        self.hard_deadline = max(self.hard_deadline, now + timeout)
        if fresh_output:
            self.buffers = {self.out_r: bytearray(), self.err_r: bytearray()}
            self.dropped = 0
        self.wait_seen = 0.0  # CPU-wait of this stage, sampled for runs past their first slice
        self.next_sample = now + self.demote_after  # then a tick after each sample: never once per event
        self.wait_base: Optional[tuple[float, float, float]] = None
        self.cpu_seen = 0.0
        self.demoted = False
        self.reniced: set[int] = set()  # the processes set to nice 19 since its demotion
        self.timed_out = False
        self.starved = False

    def deadline(self) -> float:
        return min(self.stage_started + self.stage_timeout + self.wait_seen, self.hard_deadline)

    def next_timer(self) -> Optional[float]:
        due = self.killed_at + KILL_WAIT if self.killed_at is not None else self.next_tick()
        return min((when for when in (due, *self.throttled.values()) if when is not None), default=None)

    def next_tick(self) -> Optional[float]:
        """When the running stage next needs looking at: its slice, its samples, its deadline."""
        due = self.deadline()
        return min(due, self.next_sample)

    # -- events ----------------------------------------------------------------------------------
    def on_event(self, zygote: JobHost, fd: int) -> None:
        if fd == self.pidfd:
            zygote.unwatch(fd)
            self._exited(zygote)
            return
        self._take(zygote, fd)

    def _take(self, zygote: JobHost, fd: int) -> None:
        """One read of a pipe of the job's: output, records, or its end."""
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            self._close(zygote, fd)
        elif fd == self.meta_r:
            self._take_meta(zygote, chunk)
        else:
            self._keep(fd, chunk)
            if len(self.buffers[fd]) >= self.limits["output_limit"] and fd not in self.throttled:
                zygote.unwatch(fd)
                self.throttled[fd] = time.monotonic() + DRAIN_PAUSE

    def resume_drains(self, zygote: JobHost, now: float) -> None:
        """Watch again the pipes past their limit whose pause is over (one more read each, then another pause)."""
        for fd, due in list(self.throttled.items()):
            if now >= due:
                del self.throttled[fd]
                if fd in self.open_fds:  # a session's pause between calls takes it out of `throttled` first
                    zygote.watch(self, [fd])

    def _close(self, zygote: JobHost, fd: int) -> None:
        zygote.unwatch(fd)
        self.open_fds.discard(fd)
        os.close(fd)

    def _keep(self, fd: int, chunk: bytes) -> None:
        buf = self.buffers[fd]
        room = self.limits["output_limit"] - len(buf)
        if room > 0:
            buf += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def _take_meta(self, zygote: JobHost, chunk: bytes) -> None:
        self.meta_bytes += len(chunk)
        if self.meta_bytes > self.meta_budget:
            if not self.overflowed:
                self.overflowed = True
                self.meta.clear()
                self.kill_for_cap(zygote, f"its records to the server passed {self.meta_budget} bytes")
            return
        for line in self.meta.feed(chunk):
            if not line:
                continue  # the blank line each record starts with (wire.report)
            text = line.decode("utf-8", "replace")
            try:
                if bulk_of(text):  # never parsed, here or in the server: parsing it would cost far past its size
                    continue
                record = loads(text)
            except ValueError:
                continue  # the job may write garbage into its inherited fd 3; it only hurts itself
            if not isinstance(record, dict):
                continue
            try:
                self.on_record(zygote, record)
            except Exception as exc:  # one shaped to break its handling: the job is ended, never the zygote
                self.kill_for_cap(zygote, f"it wrote a record the sandbox cannot take ({type(exc).__name__})")
                return

    def on_record(self, zygote: JobHost, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_time(self, zygote: JobHost, now: float) -> None:
        if self.throttled:
            self.resume_drains(zygote, now)
        if self.killed_at is not None:
            if not self.exited and now >= self.killed_at + KILL_WAIT:
                self.end_reason += f"; its processes were still exiting {KILL_WAIT:g} s after SIGKILL"
                self.status = signal.SIGKILL  # a wait status: killed by SIGKILL
                self.on_exit(zygote)  # answer (the client's deadline is near); collected when it goes
            return
        if self.watch_memory and self.alive and now - self.memory_checked >= TICK / 2:
            self.memory_checked = now  # sampled at most once a tick (on_time runs after every event of the zygote)
            memory = procfs.tree_memory(self.pid, self.fork_inits, self.own_processes())
            self.hidden = {pid: self.hidden.get(pid, 0) + 1 for pid in memory.hidden}
            if max(self.hidden.values(), default=0) >= HIDDEN_SAMPLES:
                self.kill_for_cap(zygote, "its memory cannot be measured against its limit: a process of it made "
                                          "itself undumpable (prctl PR_SET_DUMPABLE 0, or a program it cannot read)")
                return
            if memory.used + self.socket_bytes(memory.readable, memory.sockets) > self.limits["memory"]:
                self.memory_killed = True
                self.kill(zygote, MEMORY_KILLS["own"])
                return
        if self.watch_processes and self.alive and self._over_processes(now):
            self.kill_for_cap(zygote, f"more than {self.limits['nproc']} processes")
            return
        if self.files_cap and now - self.files_checked >= TICK and self.over_files_cap(zygote, now):
            return
        self.on_tick(zygote, now)

    def over_files_cap(self, zygote: JobHost, now: float) -> bool:
        """Where no tmpfs bounds a job's files (the landlock rung), their blocks and entries against the
        caps; a job past one is ended.  Counted no more often than COUNT_SHARE of the zygote's time
        allows (a count of a large tree holds up every job of the zygote): a count is due once
        `files_checked` is that far behind."""
        if not self.files_cap or not self.alive or now - self.files_checked < self.files_cost / COUNT_SHARE:
            return False
        started = time.monotonic()
        named = procfs.directory_size(self.files_dir, self.files_cap, FILES_ENTRIES)
        self.files_checked = time.monotonic()
        self.files_cost = self.files_checked - started
        if named.entries > FILES_ENTRIES:
            self.kill_for_cap(zygote, f"its files passed {FILES_ENTRIES:,} entries")
            return True
        if named.size <= self.files_cap and \
                named.size + procfs.unnamed_files(self.pid, self.files_device) <= self.files_cap:
            return False
        self.kill_for_cap(zygote, f"its files passed {self.files_cap >> 20} MB")
        return True

    def on_tick(self, zygote: JobHost, now: float) -> None:
        raise NotImplementedError

    def past_deadline(self, zygote: JobHost, now: float) -> bool:
        """Keep the stage's clock: sample it once it outlives its first slice of wall time and each tick
        after (not at each of the zygote's events: a sample walks the job's processes), and at its
        deadline mark it timed out (starved: cut off by the client's deadline before it had its own
        time-out of running time)."""
        if now >= self.next_sample:
            self.sample(zygote)
        if now < self.deadline():
            return False
        self.timed_out = True
        self.starved = self.hard_deadline < self.stage_started + self.stage_timeout + self.wait_seen
        return True

    def sample(self, zygote: JobHost) -> None:
        """CPU time used and time spent waiting for a CPU, over the job's processes.  Once they have
        had a slice of CPU between them the job is demoted: its group to the least weight and each of
        its processes (setsid or not, every thread) to nice 19, so fresh runs get the CPU first.  A job
        that outlived its slice waiting for a CPU (a busy machine) is not long, and keeps its weight.
        Where no cgroup counts the job's CPU whole, what /proc shows of it can be hidden (children the
        kernel reaps), so the job is demoted once it outlives its slice, whatever it used.
        The wait credited is at most the wall time the run did not spend on a CPU: a run whose
        processes (a fork bomb) had a CPU's worth between them was not starved, however long each waited.
        What a sample reads is bounded whatever the job runs: with a group, its count and the waits of
        its first WAITS_READ processes (fewer read only credits less), and each process reniced once."""
        now = time.monotonic()
        self.next_sample = now + TICK
        members = zygote.groups.members(self.groups)
        processes = members if members is not None else list(procfs.tree(self.pid, 256, self.fork_inits))
        counted = zygote.groups.cpu_used(self.groups)  # every process, those gone unwaited for too
        if counted is None:
            cpu, wait = procfs.cpu_of(processes)
        else:
            cpu, wait = counted, procfs.longest_wait(processes[:WAITS_READ])
        if self.wait_base is None:
            self.wait_base = self.sample_base(cpu, wait, now)
        base_cpu, base_wait, since = self.wait_base
        self.cpu_seen = cpu - base_cpu
        self.wait_seen = max(self.wait_seen, min(wait - base_wait, now - since - self.cpu_seen))
        if not self.demoted and (counted is None or self.cpu_seen >= self.demote_after):
            self.demoted = True
            zygote.groups.weigh(self.groups, DEMOTED)
        if self.demoted:  # those started since inherit nice 19, but for a race with the walk
            fresh = [pid for pid in processes if pid not in self.reniced]
            procfs.renice_all(fresh)
            self.reniced.update(fresh)

    def sample_base(self, cpu: float, wait: float, now: float) -> tuple[float, float, float]:
        """What the stage's CPU and wait count from, and since when: a fresh run's processes, from the stage's start."""
        return 0.0, 0.0, self.stage_started

    def _over_processes(self, now: float) -> bool:
        """Counted at most once a tick, as memory is."""
        if now - self.processes_checked < TICK / 2:
            return False
        self.processes_checked = now
        return sum(1 for _ in procfs.tree(self.pid, self.limits["nproc"] + 1, self.fork_inits)) > self.limits["nproc"]

    def socket_bytes(self, member: int, held: Collection[int]) -> int:
        """What its sockets queue (socket_memory.py), through a probe of the network namespace that
        `member`, a process of it, is in (not always PID 1's: a session's is undumpable, its /proc
        closed to a zygote without CAP_SYS_PTRACE; and a ready child may not have made its own yet)."""
        try:
            inode = os.stat(f"/proc/{member}/ns/net").st_ino
        except OSError:
            return 0  # gone, or none of it readable (ended for that after HIDDEN_SAMPLES)
        try:
            if self.sockets is None or self.sockets[0] != inode:
                self.close_probe()
                self.sockets = (inode, self._probe(member, inode))
            probe = self.sockets[1]
            return probe.queued(held, member) if probe is not None else 0
        except OSError as exc:  # never the zygote's end: the job goes on, its sockets uncounted, said once
            print(f"verl-sf: cannot count the sockets of job {self.id}: {exc}", file=sys.stderr)
            self.close_probe()
            self.sockets = (inode, None)
            return 0

    @staticmethod
    def _probe(member: int, inode: int) -> SocketProbe:
        if inode == os.stat("/proc/self/ns/net").st_ino:
            return SocketProbe(None)
        network = os.open(f"/proc/{member}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return SocketProbe(network)
        finally:
            os.close(network)

    def close_probe(self) -> None:
        if self.sockets is not None and self.sockets[1] is not None:
            self.sockets[1].close()
        self.sockets = None

    def own_processes(self) -> Collection[int]:
        """Its processes that run no user code (undumpable by design: what runs below cannot trace them)."""
        return ()

    # -- endings ---------------------------------------------------------------------------------
    def kill(self, zygote: JobHost, reason: str) -> None:
        self.note_kill(zygote, reason)
        if not self.exited:
            self.kill_processes(zygote)
        # Only now its exits go ahead of live runs: a fork bomb at that weight, still running, would
        # keep the zygote from the walk that kills it.
        zygote.groups.weigh(self.groups, KILLED)

    def note_kill(self, zygote: JobHost, reason: str) -> None:
        """Why the job ends, and when the kill was sent."""
        self.end_reason = self.end_reason or reason
        self.alive = False
        if self.killed_at is None and not self.exited:
            self.killed_at = time.monotonic()

    def kill_processes(self, zygote: JobHost) -> None:
        """All of it now, each exit reniced, rather than when PID 1's exit ends its namespace: no
        process of it runs after this, and none in the zygote's place before it answers."""
        procfs.kill_all(self.pid)

    def kill_for_cap(self, zygote: JobHost, cap: str) -> None:
        """Ended past a cap the kernel does not enforce here: its stderr says which."""
        self.cap_exceeded = self.cap_exceeded or cap
        self.kill(zygote, f"killed: {cap}")

    def _exited(self, zygote: JobHost) -> None:
        """PID 1 is gone, and with it (its PID namespace ended) every process of the job: collect
        it, take what is left in the pipes (no writer is left), then answer."""
        if self.exited:
            return
        self.exited = True
        self.collected = True
        if not self.adopted:
            _, self.status, usage = os.wait4(self.pid, 0)
            self.cpu_used = usage.ru_utime + usage.ru_stime
        if not zygote.isolated:
            zygote.reap_orphans()  # no PID namespace ended them: its reaper does
        self.drain(zygote)
        self.on_exit(zygote)

    def end_now(self, zygote: JobHost, status: int) -> None:
        """Answer with PID 1's wait status known before the kernel reports it: once every process
        of the job is killed none runs code again; the teardown and the collection come after (retire)."""
        if self.cpu_used is None:
            self.cpu_used = procfs.cpu_time(self.pid)
        procfs.kill_all(self.pid)
        if not zygote.isolated:
            zygote.reap_orphans()  # what PID 1 left to the zygote if it exited as the walk began
        self.exited = True
        self.status = status
        self.drain(zygote)
        self.on_exit(zygote)

    def on_exit(self, zygote: JobHost) -> None:
        raise NotImplementedError

    def note_memory(self, zygote: JobHost, reply: StageResult) -> None:
        scope: Optional[MemoryScope] = "own" if self.memory_killed else zygote.groups.memory_kill(self.groups)
        self.memory_exceeded = scope is not None
        if scope is not None:
            self.end_reason = MEMORY_KILLS[scope]
            reply["memory_exceeded"] = True
            reply["memory_scope"] = scope

    def stage_result(self, status: str, return_code: Optional[int], cpu_time: Optional[float]) -> StageResult:
        result: dict[str, Any] = {"status": status, "return_code": status_of(return_code),
                                  "execution_time": time.monotonic() - self.stage_started,
                                  "cpu_time": seconds_of(cpu_time)}
        if self.wait_base is not None:  # sampled: it outlived its first slice
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
        if self.cap_exceeded:
            err += f"\n[verl-sf: killed: {self.cap_exceeded}]\n"
        result["stdout"], result["stderr"] = out, err
        result["truncated"] = self.dropped > 0 or self.overflowed or any(
            record.get("truncated") is True for record in self.records)
        stage: StageResult = result  # type: ignore[assignment]
        return stage

    def keep(self, record: dict[str, Any]) -> None:
        """A record for the reply.  A cell's displays past MAX_DISPLAYS in the job are left out, with a
        note (an E2B execution's result and own note kept): each costs the server a few tokens to
        parse, and cells under the cap one by one (`wire.bulk_of`) add up."""
        shown = record.get("display") if record.get("kind") == "cell" else None
        if isinstance(shown, list):
            room = max(0, MAX_DISPLAYS - self.displays)
            if len(shown) > room:
                noted = shown[-1].get(NOTE) if shown and isinstance(shown[-1], dict) else None
                main = noted.get("main") if isinstance(noted, dict) else None
                kept = kept_displays(shown, room, main if type(main) is int else None)
                record["display"], record["truncated"] = kept, True
                record["stderr"] = str(record.get("stderr", "")) + DISPLAYS_LEFT_OUT.format(
                    count=len(shown) - len(kept), why=f"more than {MAX_DISPLAYS:,} displays in one run")
            self.displays += len(record["display"])
        self.records.append(record)

    def cells(self) -> list[Any]:
        return [record for record in self.records if record.get("kind") == "cell"]

    def drain(self, zygote: JobHost) -> None:
        """Output already in the pipes is this job's (or this call's): take it without waiting, and no
        more than the pipes can hold (a writer still running must not keep the zygote reading)."""
        # One poll a read, the first ready pipe in this order (a take can end the call and drain, or close, the rest).
        for _ in range(DRAIN_READS):
            ready = readable_of([fd for fd in (self.out_r, self.err_r, self.meta_r) if fd in self.open_fds])
            if not ready:
                return
            self._take(zygote, ready[0])


# A session's and a cells run's records come from the process that runs the code: their numbers are
# taken only when they are of their type (an int status; a finite, non-negative count of seconds).
def status_of(value: Any) -> Optional[int]:
    return value if type(value) is int and -(1 << 31) <= value < (1 << 31) else None


def seconds_of(value: Any) -> Optional[float]:
    return float(value) if type(value) in (int, float) and 0 <= value < float("inf") else None
