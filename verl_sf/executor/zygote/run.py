"""A one-shot run: an optional compile stage, then the program, answered once it has ended.

A run is answered as soon as its end is known from something it cannot forge, every process of it
killed first (Job.end_now): its PID 1 held in exit_group (`hold_exit`: exits.py), the `done` record of an
exec run's PID 1 (which runs no user code), or the zygote's own kill (a time-out, a cap, a cancel).
Otherwise, once the kernel reports PID 1 gone."""

from __future__ import annotations

import os
import signal
from collections.abc import Collection
from typing import Any, Optional

from . import exits, procfs
from .job import Job, JobHost
from .messages import RunHead, RunReply, StageResult
from .wire import pending, readable, setup_failure, unsent


class Run(Job):
    def __init__(self, zygote: JobHost, head: RunHead, body: bytes):
        super().__init__(zygote, head, body)
        self.head = head
        self.compile_result: Optional[StageResult] = None
        self.program_done: Optional[float] = None  # an exec run's program ended: its CPU seconds

    def register(self, zygote: JobHost) -> None:
        zygote.runs[self.id] = self

    def first_timeout(self) -> float:
        return self.head["compile_timeout"] or self.limits["timeout"]

    def start(self, zygote: JobHost) -> None:
        super().start(zygote)
        if self.job_w < 0:
            return
        if self.head["hold_exit"]:
            zygote.watch(self, (self.job_w,))
        # Otherwise kept until the child has read its job (on_tick), then closed: a run reads its job to the end.

    def on_event(self, zygote: JobHost, fd: int) -> None:
        if fd == self.job_w:
            self.listener, said = exits.receive(fd)  # nothing else comes on it: it is done with either way
            self.failure = self.failure or setup_failure(said)
            self.close_job_socket(zygote)
            if self.listener >= 0:
                zygote.watch(self, (self.listener,))
                if readable(self.listener):  # a short run may be asking to exit already
                    self.on_exit_call(zygote)
        elif fd == self.listener:
            self.on_exit_call(zygote)
        else:
            super().on_event(zygote, fd)
            if self.program_done is not None and self.alive and not self.exited:
                self.cpu_used = self.program_done
                self.end_now(zygote, 0)  # the program's own status is in the record (on_exit)

    def close_job_socket(self, zygote: JobHost) -> None:
        if self.job_w >= 0 and not self.failure:  # a child that failed to set up said so there
            self.failure = setup_failure(pending(self.job_w))
        super().close_job_socket(zygote)

    def own_processes(self) -> Collection[int]:
        return (self.pid,) if self.head["exec"] else ()  # an exec run's PID 1 only waits for its program

    def kill_processes(self, zygote: JobHost) -> None:
        self.end_now(zygote, signal.SIGKILL)  # kills it all, answering with a SIGKILLed process's wait status

    def on_exit_call(self, zygote: JobHost) -> None:
        notice = exits.take(self.listener)
        if notice is None:
            return
        notice_id, tid, code = notice
        # Any thread of PID 1 ends it: the first one's call is the status the kernel would report (a
        # thread's call let go could end PID 1 with its status after another thread's was taken).
        if self.alive and not self.exited and procfs.thread_of(self.pid, tid):
            self.end_now(zygote, code << 8)  # the wait status of exit(code)
        else:
            exits.let_go(self.listener, notice_id)  # any other process of the run, exiting

    def on_record(self, zygote: JobHost, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "compiled" and self.head["exec"] and self.compile_result is None:
            compiled = self.stage_result("Finished", record.get("return_code"), record.get("cpu_time"))
            compiled["stdout"], compiled["stderr"] = record.get("stdout", ""), record.get("stderr", "")
            compiled["truncated"] = record.get("truncated") is True
            self.compile_result = compiled
            self.begin_stage(self.limits["timeout"], fresh_output=False)  # the program may have written already
        elif kind == "unstarted" and self.head["exec"] and isinstance(record.get("error"), str):
            self.failure = record["error"]  # only an exec run's PID 1 runs no user code: only it is believed
        elif kind in ("cell", "done"):
            self.keep(record)
            if kind == "done" and self.head["exec"] and isinstance(record.get("cpu_time"), (int, float)):
                self.program_done = float(record["cpu_time"])  # answered after this read (on_event)

    def on_tick(self, zygote: JobHost, now: float) -> None:
        if self.job_w >= 0:  # until its child has read its job (one that holds its exit: until its listener came)
            if self.unsent or unsent(self.job_w):
                # Its child is still setting up (under a fork storm its cgroup join waits on the kernel's
                # cgroup lock): no code of the run's has started, so neither has its clock.
                self.stage_started = now
            elif not self.head["hold_exit"]:  # read: nothing of the run's can put it back
                self.close_job_socket(zygote)
        if self.past_deadline(zygote, now):
            self.kill(zygote, "timed out")

    def on_exit(self, zygote: JobHost) -> None:
        if self.id not in zygote.runs:
            return
        self.close_job_socket(zygote)
        if self.failure:
            zygote.reply({"kind": "failed", "id": self.id, "error": self.failure})
            zygote.retire(self)
            return
        done = next((r for r in reversed(self.records) if r.get("kind") == "done"), None)
        code: Optional[int] = os.waitstatus_to_exitcode(self.status)
        if self.head["exec"] and done is not None and not self.timed_out:
            code = done.get("return_code")  # the program's own status, signals included
        if self.timed_out:
            code = -signal.SIGKILL
        stage = self.stage_result("TimeLimitExceeded" if self.timed_out else "Finished", code, self.cpu_used)
        reply: RunReply = {**stage, "kind": "run", "id": self.id}
        if self.compile_result is not None:
            reply["compile"] = self.compile_result
            reply["truncated"] = reply.get("truncated", False) or self.compile_result.get("truncated", False)
        if done is not None and "files" in done:
            reply["files"] = done["files"]
        cells = self.cells()
        if cells:
            reply["cells"] = cells
        if self.end_reason == "cancelled":
            reply["error"] = "cancelled"
        self.note_memory(zygote, reply)
        zygote.reply(reply)
        zygote.retire(self)
