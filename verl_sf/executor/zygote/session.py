"""A session: a live interpreter that takes one call after another until it is closed or dies.

Its PID 1 runs no user code and only reaps (child.py); the interpreter is PID 1's child.  The
session ends when the interpreter does; its PID namespace, when PID 1 does, which waits for the
session's forks (fork_request.py: each a child of PID 1, in a PID namespace below) to end first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Collection
from typing import Any, Optional

from . import linux, procfs, root
from .interactive import BASH_CALL
from .interrupts import Interrupt
from .job import Job, JobHost, seconds_of, status_of
from .messages import CallReply, Limits, SessionCallBody, SessionCallHead, SessionOpenHead, StageResult
from .run_groups import DEMOTED, Groups
from .wire import loads, pending, setup_failure

IDLE_SESSION_TICK = 1.0  # seconds between an idle session's memory samples (no memory cgroup) or files' counts
BASH_CALL_LINE = BASH_CALL.encode() + b"\n"
STARTUP_ERROR_CHARS = 500  # of what a session that never started wrote to stderr, the end kept in its reason
# How long an interpreter that exited by itself waits for its PID 1 (which does nothing else) to reap
# it, so that the call it ended has its exit code, and how often that is looked at meanwhile.
REAP_WAIT, REAP_LOOK = 0.05, 0.0005
OWN_EXIT_CODES = linux.kernel_version() >= linux.PIDFD_EXIT_KERNEL


def refuse_call(zygote: JobHost, head: SessionCallHead, session_end: str) -> None:
    """Answer a call to a session that has ended, and why it ended."""
    zygote.reply({"kind": "call", "id": head["id"], "status": "Error", "session_alive": False,
                  "error": "the session is not running", "session_end": session_end})


class SessionJob(Job):
    def __init__(self, zygote: JobHost, head: SessionOpenHead, body: bytes):
        super().__init__(zygote, head, body)
        self.language = head["language"]
        self.call: Optional[SessionCallHead] = None  # the call in progress
        self.fetch_paths: list[str] = []  # a bash call's fetch_files, in order
        self.interrupted: Optional[Interrupt] = None  # the call in progress was interrupted at its time-out
        self.interpreter = -1  # its pid, once ready
        self.interpreter_fd = -1  # a pidfd of it: the session ends with it
        self.reap_due: Optional[float] = None  # it exited by itself: when its exit code is no longer waited for
        self.exit_code: Optional[int] = None  # its own, when it exited by itself
        self.root_helper = -1  # its root helper's pid, where it has one (root.py)
        self.parent: Optional[SessionJob] = None
        self.forks: set[SessionJob] = set()  # its forks whose PID 1 lives
        self.frozen = False  # a snapshot: stopped for good, only forked
        self.forking = False  # a forker has it stopped
        self.paused: set[int] = set()  # its output pipes not read until its next call (_take)
        self.layers = 0  # Landlock domains stacked on its interpreter (one per fork)
        self.announced = False  # its end was told to the server
        self.unstarted = ""  # why its PID 1 could not start the interpreter (capacity, not a fault)

    @classmethod
    def adopt(cls, zygote: JobHost, new_id: int, source: SessionJob, limits: Limits, init: int, interpreter: int,
              fds: list[int], groups: Groups, frozen: bool, pidfds: tuple[int, int]) -> SessionJob:
        """A copy forked from `source`, taken on as a session of its own, idle; `pidfds`: its PID 1's and its
        interpreter's, opened while both were known to live."""
        head: SessionOpenHead = {"op": "open", "id": new_id, "language": source.language, "limits": limits,
                                 "rooted": False}
        copy = cls(zygote, head, b"")
        copy.adopted = True
        copy.frozen = frozen
        copy.parent = source
        copy.layers = source.layers + (0 if frozen else 1)  # a live copy enters a Landlock domain of its own
        out_r, err_r, meta_r, job_w = fds
        copy.attach(zygote, init, out_r, err_r, meta_r, job_w, groups, pidfds[0])
        copy._watch_interpreter(zygote, interpreter, pidfds[1])
        copy.hard_deadline = time.monotonic()
        copy.begin_stage(0)
        source.forks.add(copy)
        source.fork_inits.add(init)
        return copy

    def _watch_interpreter(self, zygote: JobHost, pid: int, pidfd: int = -1) -> None:
        self.interpreter = pid
        self.interpreter_fd = pidfd if pidfd >= 0 else os.pidfd_open(pid)
        zygote.watch(self, (self.interpreter_fd,))

    def background(self) -> list[int]:
        """The session's processes beside its interpreter (its own, root's, or orphans PID 1 took in)."""
        own = (self.interpreter, self.root_helper)
        rooted = procfs.children(self.root_helper) if self.root_helper > 0 else []
        return [*procfs.children(self.interpreter), *rooted,
                *(pid for pid in procfs.children(self.pid) if pid not in own and pid not in self.fork_inits)]

    def register(self, zygote: JobHost) -> None:
        zygote.sessions[self.id] = self

    def next_tick(self) -> Optional[float]:
        if self.reap_due is not None:
            return min(self.reap_due, time.monotonic() + REAP_LOOK)
        if self.call is None:  # an idle session holds no timer, but for the memory and files watchdogs
            watched = (self.watch_memory or self.files_cap) and self.alive
            return time.monotonic() + IDLE_SESSION_TICK if watched else None
        if self.interrupted is not None:
            now = time.monotonic()
            return min(self.interrupted.due(now), self.interrupted.cutoff(self.hard_deadline))
        return super().next_tick()

    def deadline(self) -> float:
        """A call is interrupted early enough that its grace ends before the client's deadline."""
        grace = self.call["grace"] if self.call is not None else 0.0
        return min(super().deadline(), self.hard_deadline - grace)

    def sample_base(self, cpu: float, wait: float, now: float) -> tuple[float, float, float]:
        return cpu, wait, now  # what earlier calls used is not this call's

    # -- calls -----------------------------------------------------------------------------------
    def begin_call(self, zygote: JobHost, head: SessionCallHead, body: bytes) -> None:
        if self.call is not None or self.frozen:
            zygote.reply({"kind": "call", "id": head["id"], "status": "Error", "session_alive": True,
                          "error": "the session is a snapshot: it takes no calls" if self.frozen
                          else "the session is busy with another call"})
            return
        if self.unsent:  # its last call never reached it whole: the next would be read as that one's rest
            reason = "its code kept its interpreter from reading its last call"
            self.kill(zygote, reason)
            refuse_call(zygote, head, reason)
            return
        self.drain(zygote)  # output of background work between calls is not this call's
        zygote.watch(self, self.paused)
        self.paused.clear()
        self.call = head
        self.limits = head["limits"]
        self.records = []
        self.displays = 0
        self.meta_bytes = 0
        # A call whose wait for the session spent the client's budget (hand_over) still runs for its
        # time-out and has its grace: the client may be gone, the session must not be.
        self.hard_deadline = time.monotonic() + max(self.limits["hard_timeout"], self.limits["timeout"] + head["grace"])
        self.begin_stage(self.limits["timeout"])
        self.interrupted = None
        # A session once demoted stays at the lowest priority (raising it back takes CAP_SYS_NICE on the
        # host): as in a multi-level feedback queue, a job that has run long stays low.
        try:
            zygote.groups.set_limits(self.groups, self.limits, memory=False)
            # bash reads a line and NUL-terminated fields (BASH_CALL); the python session reads the JSON line itself.
            self.send(zygote, self._bash_call(loads(body.decode()), zygote.cfg["fetch_limit"])
                      if self.language == "bash" else body + b"\n")
        except OSError:
            self.kill(zygote, "the session's interpreter is gone")

    def _bash_call(self, call: SessionCallBody, fetch_limit: int) -> bytes:
        self.fetch_paths = [p for p in call.get("fetch_files") or () if p and "\0" not in p]
        fields = [call["code"], str(fetch_limit), *self.fetch_paths, ""]
        return BASH_CALL_LINE + b"".join(field.encode("utf-8", "surrogateescape") + b"\0" for field in fields)

    def own_processes(self) -> Collection[int]:
        """Its PID 1 and root helper; and until its interpreter is ready, all of it (no code of the session's ran)."""
        if self.interpreter < 0:
            return [self.pid, *procfs.children(self.pid)]
        return (self.pid, self.root_helper)

    def on_record(self, zygote: JobHost, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "call_done" and self.call is not None and _a_calls_end(record):
            self._end_call(zygote, record)
        elif kind == "session_ready" and self.call is None and self.interpreter < 0:
            # Nothing of the session's own runs yet: PID 1's children are the interpreter and its root helper.
            children = procfs.children(self.pid)
            self.root_helper = next((pid for pid in children if procfs.name(pid) == root.NAME), -1)
            self._watch_interpreter(zygote, next(pid for pid in children if pid != self.root_helper))
            zygote.reply({"kind": "session", "id": self.id, "session_alive": True,
                          "group": zygote.groups.path_of(self.groups)})
        elif kind == "unstarted" and self.interpreter < 0 and isinstance(record.get("error"), str):
            self.unstarted = record["error"]  # from its PID 1, before any code of the session's ran
        elif kind == "cell":
            self.keep(record)

    def on_tick(self, zygote: JobHost, now: float) -> None:
        if self.reap_due is not None:
            self._interpreter_ended(zygote, now)
            return
        if self.call is None:
            return
        if self.interrupted is not None:
            grace = self.interrupted.grace
            if self.interrupted.spent(now):
                self.kill(zygote, f"killed: the call ignored the interrupt at its time-out for {grace:g} s of its own"
                                  f" time: {self.interrupted.why()}")
            elif now >= self.interrupted.cutoff(self.hard_deadline):
                self.kill(zygote, f"killed: the call had not stopped on the interrupt at its time-out when the client's"
                                  f" deadline came (it waited {self.interrupted.waited():.1f} s for a CPU):"
                                  f" {self.interrupted.why()}")
            elif self.interrupted.repeat_due(now):
                self.interrupted.repeated = True
                self._send_interrupt()
            return
        if self.past_deadline(zygote, now):
            self.interrupt(now)

    def interrupt(self, now: float) -> None:
        """Interrupt the call in progress (at its time-out, or its client left); killed if it ignores that."""
        if self.call is None or self.interrupted is not None:
            return
        self.interrupted = Interrupt(self.interpreter, self.call["grace"], now)
        self._send_interrupt()

    def _send_interrupt(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.interpreter, signal.SIGINT)  # as a Jupyter kernel's interrupt
        if self.language == "bash" and self.interrupted is not None and self.interrupted.repeated:
            self._interrupt_own_groups()

    def _interrupt_own_groups(self) -> None:
        """The second time, the shell's children in process groups of their own too: a program it waits
        for there (`timeout 30 cmd`, `setsid cmd`) took no interrupt, and the shell runs its INT trap
        only once that program ends.  Not the first time: a daemon the code detached so is left alone
        by a call that stops."""
        for pid in procfs.children(self.interpreter):
            with contextlib.suppress(ProcessLookupError):
                group = os.getpgid(pid)
                if group != self.interpreter:
                    os.killpg(group, signal.SIGINT)

    def _take(self, zygote: JobHost, fd: int) -> None:
        super()._take(zygote, fd)
        # Between calls, output past what the next call could show is left in its pipe: its writer
        # waits there, rather than the zygote reading for it at full priority (red team, 2026-11-30).
        if self.call is None and fd in self.buffers and fd in self.open_fds \
                and len(self.buffers[fd]) >= self.limits["output_limit"]:
            zygote.unwatch(fd)
            self.paused.add(fd)
            self.throttled.pop(fd, None)

    def _end_call(self, zygote: JobHost, record: dict[str, Any]) -> None:
        assert self.call is not None
        if self.over_files_cap(zygote, time.monotonic()):  # a call may fill its files faster than a tick
            return  # the call is answered with the session's end
        self.drain(zygote)
        stage = self.stage_result("TimeLimitExceeded" if self.timed_out else "Finished",
                                  record.get("return_code"), record.get("cpu_time"))
        reply: CallReply = {**stage, "kind": "call", "id": self.call["id"], "session_alive": True}
        if "files" in record:
            reply["files"] = record["files"]
        elif isinstance(record.get("fetched"), list):  # a bash session's files, in the order they were asked for
            fetched = zip(self.fetch_paths, record["fetched"], strict=False)
            reply["files"] = {path: data for path, data in fetched if data is not None}
        cells = self.cells()
        if cells:
            reply["cells"] = cells
        self.call = None
        self.interrupted = None
        zygote.reply(reply)
        # Whatever runs until the next call is background: processes the call left, its threads, or code
        # that wrote this record itself and runs on.  Its group drops to the lowest CPU weight, and the
        # processes to nice 19 (after the reply: a walk of /proc nothing of the call waits for); the next
        # call raises the group again.
        if not self._alone(zygote):
            for pid in self.background():
                procfs.renice_all(procfs.tree(pid, 256))
        zygote.groups.weigh(self.groups, DEMOTED)

    def _alone(self, zygote: JobHost) -> bool:
        """Whether the session's group holds none but its own processes: one read of it, where
        `background` reads two directories and two files of /proc (after each call)."""
        members = zygote.groups.members(self.groups)
        return members is not None and set(members) <= {self.pid, self.interpreter, self.root_helper}

    # -- ending ----------------------------------------------------------------------------------
    def on_event(self, zygote: JobHost, fd: int) -> None:
        if fd == self.interpreter_fd:
            zygote.unwatch(fd)
            self.drain(zygote)
            now = time.monotonic()
            if OWN_EXIT_CODES and not (self.end_reason or self.failure or self.timed_out):
                self.reap_due = now + REAP_WAIT
            self._interpreter_ended(zygote, now)
            return
        super().on_event(zygote, fd)

    def _interpreter_ended(self, zygote: JobHost, now: float) -> None:
        """The session ends with its interpreter: once its exit code is known, where it exited by
        itself (`exit 3` in bash, `os._exit(3)`) and the kernel keeps it (linux.reaped_exit_code)."""
        if self.reap_due is not None and now < self.reap_due:
            self.exit_code = linux.reaped_exit_code(self.interpreter_fd)
            if self.exit_code is None:
                return  # looked at again on the next tick
            self.reap_due = None
        self._release_interpreter()
        if not self.announced:
            self._announce(zygote)
        self._end_rest(zygote)

    def _release_interpreter(self) -> None:
        """Its pidfd closed; its exit code read first where it was still waited for (a last look)."""
        if self.reap_due is not None:
            self.exit_code = linux.reaped_exit_code(self.interpreter_fd)
            self.reap_due = None
        os.close(self.interpreter_fd)
        self.interpreter_fd = -1

    def kill(self, zygote: JobHost, reason: str) -> None:
        if self.forks:
            self.end_reason = self.end_reason or reason
            self.alive = False
            self._end_rest(zygote)
        else:
            super().kill(zygote, reason)

    def _end_rest(self, zygote: JobHost) -> None:
        """The interpreter and everything of the session's own ends; PID 1 lives on while forks do
        (it ends by itself after them)."""
        if not self.forks:
            super().kill(zygote, self.end_reason or "its interpreter exited")
            return
        # What a killed process leaves goes up to PID 1, alive: look again until nothing new is there.
        killed: set[int] = set()
        for _ in range(64):
            fresh = [pid for pid in (self.interpreter, *self.background()) if pid > 0 and pid not in killed]
            if not fresh:
                return
            for pid in fresh:
                procfs.kill_all(pid)
                killed.add(pid)

    def on_exit(self, zygote: JobHost) -> None:
        """PID 1 is gone, and with it every process of the session."""
        if self.id not in zygote.sessions:
            return
        self.alive = False
        if self.parent is not None:
            self.parent.forks.discard(self)
        if self.interpreter_fd >= 0:
            if self.reap_due is None:  # else it exited first, and is reaped now that its PID 1 is gone
                zygote.unwatch(self.interpreter_fd)
            self._release_interpreter()
        if not self.announced:
            self._announce(zygote)
        zygote.retire(self)

    def _announce(self, zygote: JobHost) -> None:
        """Tell the server the session ended (and the call in progress, if any, with it)."""
        self.announced = True
        self.alive = False
        ended: StageResult = {}
        self.note_memory(zygote, ended)
        reason = self.unstarted or self.failure or self.end_reason or "its interpreter exited"
        if self.interpreter < 0 and self.call is None:  # it never started: what its set-up said is why
            reason = (setup_failure(pending(self.job_w)) if self.job_w >= 0 else "") or reason
            self.drain(zygote)
            said = self.buffers.get(self.err_r, b"").decode("utf-8", "replace").strip()
            if said:
                reason = f"{reason}: {said[-STARTUP_ERROR_CHARS:]}"
        if self.call is not None:
            own_exit = None if self.memory_exceeded else self.exit_code  # the kernel's kill is not the code's exit
            stage = self.stage_result("TimeLimitExceeded" if self.timed_out else "Finished", own_exit, None)
            reply: CallReply = {**stage, **ended, "kind": "call", "id": self.call["id"], "session_alive": False,
                                "session_end": reason}
            cells = self.cells()  # those that ran before the end, as a time-out keeps them
            if cells:
                reply["cells"] = cells
            zygote.reply(reply)
            self.call = None
        zygote.reply({"kind": "session", "id": self.id, "session_alive": False, "session_end": reason,
                      "limit": bool(self.unstarted)})
        self.close_job_socket(zygote)


def _a_calls_end(record: dict[str, Any]) -> bool:
    """Whether a `call_done` has the shape the interpreter writes (an int status; seconds; files by
    path): the call's code can write one itself, and one of another shape is its garbage, not its end."""
    return (status_of(record.get("return_code")) is not None and seconds_of(record.get("cpu_time", 0.0)) is not None
            and isinstance(record.get("files", {}), dict) and isinstance(record.get("fetched", []), list))
