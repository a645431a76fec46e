"""A session: a live child that takes one call after another until it is closed or dies."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Optional

from . import procfs
from .job import Job, Zygote
from .messages import Limits, Reply, SessionCallBody, SessionCallHead, SessionOpenHead
from .run_groups import Groups
from .wire import loads, write_all

IDLE_SESSION_TICK = 1.0  # seconds between memory samples of an idle session without a memory cgroup


class Session(Job):
    def __init__(self, zygote: Zygote, head: SessionOpenHead, body: bytes):
        super().__init__(zygote, head, body)
        self.language = head["language"]
        self.call: Optional[SessionCallHead] = None  # the call in progress
        self.fetch_paths: list[str] = []  # a bash call's fetch_files, in order
        self.interrupted_at: Optional[float] = None
        # Forks (forks.py): a copy lives in its parent's PID namespace, so a parent ended while
        # copies live is held, stopped, until the last one ends.
        self.parent: Optional[Session] = None
        self.forks: set[Session] = set()
        self.fork_pids: set[int] = set()  # every copy ever made of it (our pids): its children, not its own work
        self.frozen = False  # a snapshot: stopped for good, only forked
        self.held = False
        self.announced = False  # its end was told to the server

    @classmethod
    def adopt(cls, zygote: Zygote, new_id: int, source: Session, limits: Limits, pid: int, fds: list[int],
              groups: Groups, frozen: bool) -> Session:
        """A copy forked from `source`, taken on as a session of its own, idle."""
        head: SessionOpenHead = {"op": "open", "id": new_id, "language": source.language, "limits": limits}
        copy = cls(zygote, head, b"")
        copy.adopted = True
        copy.frozen = frozen
        copy.parent = source
        out_r, err_r, meta_r, job_w = fds
        copy.attach(zygote, pid, out_r, err_r, meta_r, job_w, groups)
        copy.hard_deadline = time.monotonic()
        copy.begin_stage(0)
        source.forks.add(copy)
        source.fork_pids.add(pid)
        return copy

    def register(self, zygote: Zygote) -> None:
        zygote.sessions[self.id] = self

    def next_tick(self) -> Optional[float]:
        if self.call is None:  # an idle session holds no timer, but for the memory watchdog
            return time.monotonic() + IDLE_SESSION_TICK if self.watch_memory and self.alive else None
        if self.interrupted_at is not None:
            return self.interrupted_at + self.call["grace"]
        return super().next_tick()

    def sample_base(self, cpu: float, wait: float) -> tuple[float, float]:
        return cpu, wait  # what earlier calls used is not this call's

    # -- calls -----------------------------------------------------------------------------------
    def begin_call(self, zygote: Zygote, head: SessionCallHead, body: bytes) -> None:
        if self.call is not None or self.frozen:
            zygote.reply({"id": head["id"], "status": "Error", "session_alive": True,
                          "error": "the session is a snapshot: it takes no calls" if self.frozen
                          else "the session is busy with another call"})
            return
        self.drain(zygote)  # output of background work between calls is not this call's
        self.call = head
        self.limits = head["limits"]
        self.records = []
        self.meta_bytes = 0
        self.hard_deadline = time.monotonic() + self.limits["hard_timeout"]
        self.begin_stage(self.limits["timeout"])
        self.interrupted_at = None
        # A session once demoted stays at the lowest priority (raising it back takes CAP_SYS_NICE on the
        # host): as in a multi-level feedback queue, a job that has run long stays low.
        try:
            zygote.groups.set_limits(self.groups, self.limits, memory=False)
            # bash reads NUL-terminated fields (see BASH_SESSION); the python session reads the JSON line itself.
            write_all(self.job_w, self._bash_call(loads(body.decode()), zygote.cfg["fetch_limit"])
                      if self.language == "bash" else body + b"\n")
        except OSError:
            self.kill(zygote, "the session's interpreter is gone")

    def _bash_call(self, call: SessionCallBody, fetch_limit: int) -> bytes:
        self.fetch_paths = [p for p in call.get("fetch_files") or () if p and "\0" not in p]
        fields = [call["code"], str(fetch_limit), *self.fetch_paths, ""]
        return b"".join(field.encode("utf-8", "surrogateescape") + b"\0" for field in fields)

    def on_record(self, zygote: Zygote, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "call_done" and self.call is not None:
            self._end_call(zygote, record)
        elif kind == "session_ready" and self.call is None:
            zygote.reply({"id": self.id, "status": "Finished", "session_alive": True,
                          "group": zygote.groups.path_of(self.groups)})
        elif kind == "cell":
            self.records.append(record)

    def on_tick(self, zygote: Zygote, now: float) -> None:
        if self.call is None:
            return
        if self.interrupted_at is not None:
            if now >= self.interrupted_at + self.call["grace"]:
                grace = self.call["grace"]
                self.kill(zygote, f"killed: the call ignored the interrupt at its time-out for {grace:g} s")
            return
        if self.past_deadline(now):
            self.interrupted_at = now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGINT)  # as a Jupyter kernel's interrupt

    def _end_call(self, zygote: Zygote, record: dict[str, Any]) -> None:
        assert self.call is not None
        self.drain(zygote)
        stage = self.stage_result("TimeLimitExceeded" if self.timed_out else "Finished",
                                  record.get("return_code"), record.get("cpu_time"))
        reply: Reply = {**stage, "id": self.call["id"], "session_alive": True}
        if "files" in record:
            reply["files"] = record["files"]
        elif "fetched" in record:  # a bash session's files, in the order they were asked for
            fetched = zip(self.fetch_paths, record["fetched"], strict=False)
            reply["files"] = {path: data for path, data in fetched if data is not None}
        cells = self.cells()
        if cells:
            reply["cells"] = cells
        self.call = None
        self.interrupted_at = None
        # What a call left running in the background drops to the lowest CPU priority.
        if procfs.has_children(self.pid):
            procfs.demote_tree(self.pid)
        zygote.reply(reply)

    # -- ending ----------------------------------------------------------------------------------
    def kill(self, zygote: Zygote, reason: str) -> None:
        if any(not copy.exited for copy in self.forks) and not self.exited:
            self._hold(zygote, reason)
        else:
            super().kill(zygote, reason)

    def _hold(self, zygote: Zygote, reason: str) -> None:
        """Ended while copies live: its own processes die, its interpreter stops (its PID
        namespace, theirs too, lives on) until the last copy ends."""
        self.end_reason = self.end_reason or reason
        for child in procfs.children(self.pid):
            if child not in self.fork_pids:
                procfs.kill_tree(child)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGSTOP)
        if not self.held:
            self.held = True
            self._announce(zygote)
            self.alive = False

    def on_exit(self, zygote: Zygote) -> None:
        if self.id not in zygote.sessions:
            return
        self.alive = False
        if self.parent is not None:
            self.parent.forks.discard(self)
            if self.parent.held and not any(not copy.exited for copy in self.parent.forks):
                Job.kill(self.parent, zygote, self.parent.end_reason)
            if self.parent.exited and not self.end_reason:
                self.end_reason = ("its parent session's interpreter exited (a fork lives in its parent's "
                                   "PID namespace)")
        if not self.announced:
            self._announce(zygote)
        zygote.retire(self)

    def _announce(self, zygote: Zygote) -> None:
        """Tell the server the session ended (and the call in progress, if any, with it)."""
        self.announced = True
        ended: Reply = {}
        self.note_memory(zygote, ended)
        reason = self.failure or self.end_reason or "its interpreter exited"
        if self.call is not None:
            stage = self.stage_result("TimeLimitExceeded" if self.timed_out else "Finished", None, None)
            reply: Reply = {**stage, **ended, "id": self.call["id"], "session_alive": False, "session_end": reason}
            zygote.reply(reply)
            self.call = None
        zygote.reply({"id": self.id, "status": "Finished", "session_alive": False, "session_end": reason})
        if self.job_w >= 0:
            os.close(self.job_w)
            self.job_w = -1
