"""The candidate run's trusted parent: it exists before any candidate code does, makes itself undumpable, forks
the confined child (`child`), checks the shape of the child's result stream, and alone writes the run's stdout."""

from __future__ import annotations

import json
import os
import select
import signal

from .child import _child, _leave
from .codec import _emit, decode
from .confinement import PR_SET_DUMPABLE, _prctl
from .scan import _OutputScan

RESULTS_LIMIT = 900_000  # bytes of results relayed: the report must fit the server's 1 MB stdout cap
OUTPUT_LIMIT = 1 << 20  # bytes of the candidate's output read; then its pipe closes, so a flood cannot keep us busy
# What the candidate's process may report of itself, and what the parent sees (the caller rejects other kinds).
SUSPECT_KINDS = ("non_plain_result", "forged_verdict", "early_exit", "protocol", "tampering", "frame_inspection",
                 "object_graph", "signal", "proc_access", "tracer", "forbidden_syscall")


def candidate_run(spec_json: str) -> None:
    """Run `spec["program"]`'s `spec["func_name"]` on every encoded input in a confined child; report on stdout."""
    spec = json.loads(spec_json)
    inputs = [decode(value) for value in spec["inputs"]]
    parent = _Parent(len(inputs))
    try:
        _prctl(PR_SET_DUMPABLE, 0)  # no /proc/<pid>/mem, fd or environ of this process for anyone of our uid
    except OSError as exc:
        parent.report("setup_error", f"cannot make the harness undumpable: {exc}")
        return
    results_r, results_w = os.pipe()
    output_r, output_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child(spec["program"], spec["func_name"], inputs, results_w, output_w)
        finally:
            _leave(70)  # never back into the interpreter that started us
    os.close(results_w)
    os.close(output_w)
    parent.watch(pid, results_r, output_r)


class _Parent:
    """Reads the child's results and output, checks their shape, and writes everything this run prints.

    The child's stream must be: `ready` (or `setup_error`, written before any candidate code exists), then either
    `program_error` or one `result` / `raised` / `not_plain` per test and `done`; `suspect` anywhere."""

    def __init__(self, total: int):
        self.total = total
        self.phase = "setup"  # -> tests -> done | program_error | setup_error | violated | too_large
        self.tests: list[dict] = []
        self.detail = ""
        self.suspects: set[str] = set()
        self.result_bytes = 0
        self.output_bytes = 0
        self.output = _OutputScan(self.suspects, self.suspect)

    def watch(self, pid: int, results_r: int, output_r: int) -> None:
        poller = select.poll()
        partial = {results_r: b"", output_r: b""}
        for fd in partial:
            poller.register(fd, select.POLLIN)
        while partial:
            for fd, _ in poller.poll():
                chunk = os.read(fd, 65536)
                if fd == output_r:
                    self.output_bytes += len(chunk)
                if not chunk or (fd == output_r and self.output_bytes > OUTPUT_LIMIT):
                    poller.unregister(fd)
                    os.close(fd)
                    if fd == results_r and partial[fd]:
                        self.message(partial[fd])
                    elif fd == output_r:
                        self.output.scan(chunk + b"\n")
                    del partial[fd]
                elif fd == output_r:
                    self.output.scan(chunk)
                elif self.phase != "too_large":
                    self.result_bytes += len(chunk)
                    if self.result_bytes > RESULTS_LIMIT:
                        self.phase, self.detail = "too_large", f"the results took more than {RESULTS_LIMIT} bytes"
                        os.kill(pid, signal.SIGKILL)
                        continue
                    *lines, partial[fd] = (partial[fd] + chunk).split(b"\n")
                    for line in lines:
                        self.message(line)
        if self.phase in ("done", "program_error", "setup_error", "too_large"):
            # No need to wait for the child's exit: the run's end takes it down with the rest of its processes.
            self.report("error" if self.phase == "too_large" else self.phase, self.detail)
            return
        _, status = os.waitpid(pid, 0)
        if self.phase == "violated":
            self.report("error", "the candidate's process broke the harness protocol")
        elif os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            if number == signal.SIGSYS:
                self.suspect("forbidden_syscall", "killed by the filter for a call that reads or traces another "
                                                  "process")
            self.report("error", f"the candidate's process was killed by {_signal_name(number)}"
                                 f"{self.output.last_line()}")
        else:
            self.suspect("early_exit", f"the candidate's process exited (status {os.WEXITSTATUS(status)}) after "
                                       f"{len(self.tests)} of {self.total} results")
            self.report("error", f"the program exited before all tests ran{self.output.last_line()}")

    def message(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if type(message) is not dict or len(message) != 1:
            return self.violation("a message that is not one JSON object with one key")
        ((kind, value),) = message.items()
        if kind == "suspect":
            if type(value) is list and len(value) == 2 and value[0] in SUSPECT_KINDS and type(value[1]) is str:
                return self.suspect(value[0], value[1])
            return self.violation("a malformed suspect message")
        if self.phase == "setup" and kind == "ready":
            self.phase = "tests"
        elif self.phase == "setup" and kind == "setup_error" and type(value) is str:
            self.phase, self.detail = kind, value[:500]
        elif self.phase != "tests":
            self.violation(f"{kind!r} after {self.phase}")
        elif kind == "program_error" and not self.tests and type(value) is str:
            self.phase, self.detail = kind, value[:500]
        elif kind == "done" and len(self.tests) == self.total:
            self.phase = "done"
        elif kind == "result" and len(self.tests) < self.total:
            self.tests.append({"result": value})
        elif kind in ("raised", "not_plain") and len(self.tests) < self.total and type(value) is str:
            self.tests.append({kind: value[:200]})
        else:
            self.violation(f"{kind!r} after {len(self.tests)} of {self.total} results")

    def violation(self, what: str) -> None:
        self.suspect("protocol", f"the candidate's process broke the harness protocol: {what}")
        if self.phase in ("setup", "tests"):  # after `done` the results stand
            self.phase = "violated"

    def suspect(self, kind: str, detail: str) -> None:
        """Printed at once, so a run that then times out still shows it."""
        if kind not in self.suspects:
            self.suspects.add(kind)
            _emit(1, {"suspect": [kind, detail[:300]]})

    def report(self, state: str, detail: str) -> None:
        """The last line: `state` done (with one entry per test), program_error, setup_error or error."""
        try:
            _emit(1, {"report": {"state": state, "tests": self.tests if state == "done" else [], "detail": detail}})
        except (ValueError, RecursionError):  # results nested too deep to print again
            _emit(1, {"report": {"state": "error", "tests": [], "detail": "results nested too deeply"}})


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal, which a POSIX timer can deliver
        return f"signal {number}"
