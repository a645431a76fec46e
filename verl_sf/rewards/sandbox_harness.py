"""The code-test harness that runs inside the sandbox.  Standard library only: it is sent with each request (as
bytecode where the sandbox's Python reads ours, else as source; see `code_harness`).

Two kinds of run, each one `/run_code` request:

- `reference_run`: the task alone, no candidate code.  Evaluates the test inputs (``random`` seeded with 0, as the
  TRL + Daytona example) and the reference's answers, and prints them as plain data for the caller to keep.
- `candidate_run`: the candidate's program against those inputs.  The expected answers are not in this run at all;
  the caller compares.  This process (the trusted parent: it exists before any candidate code does) makes itself
  undumpable, then forks a child that keeps none of its descriptors (stdout and stderr go to a pipe the parent
  drains, results to another), loads a seccomp filter (no ptrace or process_vm_*, no new process, thread or
  program, no signals), and only then compiles the program and calls the function on each input.  Each result
  comes back as tagged JSON of exact builtin types; the parent checks the stream's shape and alone writes stdout.

Every line the parent prints is one JSON object: `{"suspect": [kind, detail]}` as soon as it sees something only an
exploit does, then one `{"report": ...}`.  See docs/trl.md for the threat model.
"""

from __future__ import annotations

import atexit
import builtins
import ctypes
import json
import linecache
import os
import select
import signal
import struct
import sys
import types
from collections.abc import Callable
from typing import Any, NoReturn, Optional

# ---- plain data ---------------------------------------------------------------------------------------------------

_SCALARS = (type(None), bool, int, float, str)
_SEQUENCE_TYPES: dict[str, Callable[[Any], Any]] = {"tuple": tuple, "set": set, "frozenset": frozenset}


class NotPlainData(ValueError):
    """A value that is not made of exact builtin None, bool, int, float, str, bytes, list, tuple, set, frozenset
    and dict: a subclass of one of them is not plain either (its `__eq__` could say anything)."""


def encode(value: Any) -> Any:
    """`value` as JSON-ready data; lists stay arrays, other containers and bytes become one-key tagged objects.

    Types are told apart by identity only: a metaclass can make a class compare or hash equal to `int`."""
    kind = type(value)
    if kind is int or kind is str or kind is float or kind is bool or value is None:
        return value
    if kind is list:
        return [encode(item) for item in value]
    if kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [encode(item) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key), encode(item)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise NotPlainData(_type_name(kind))


def decode(data: Any) -> Any:
    """The value `encode` gave `data` for; anything else `encode` cannot produce raises NotPlainData."""
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is list:
        return [decode(item) for item in data]
    if kind is dict and len(data) == 1:
        ((tag, payload),) = data.items()
        try:
            if tag in _SEQUENCE_TYPES and type(payload) is list:
                return _SEQUENCE_TYPES[tag](decode(item) for item in payload)
            if tag == "dict" and type(payload) is list and all(type(p) is list and len(p) == 2 for p in payload):
                return {decode(key): decode(item) for key, item in payload}
            if tag == "bytes" and type(payload) is str:
                return bytes.fromhex(payload)
        except (TypeError, ValueError):  # an unhashable key or member, bad hex
            pass
    raise NotPlainData(f"not an encoded value: {str(data)[:80]}")


def _type_name(kind: type) -> str:
    """The class's name without running any of its code (a metaclass may define `__repr__`)."""
    name = type.__dict__["__qualname__"].__get__(kind)
    return name[:80] if type(name) is str else "?"


def _emit(fd: int, message: dict) -> None:
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(fd, data):]


# ---- the reference run --------------------------------------------------------------------------------------------


def _kadane(xs: list) -> Any:
    """The TRL + Daytona example's reference for `max_subarray_sum`."""
    best = running = xs[0]
    for x in xs[1:]:
        running = max(x, running + x)
        best = max(best, running)
    return best


def reference_run(spec_json: str) -> None:
    """Print `{"inputs": [...], "expected": [...]}` (encoded), or `{"task_error": ...}` if the task's code fails."""
    import copy
    import random

    spec = json.loads(spec_json)
    random.seed(0)
    namespace: dict[str, Any] = {"random": random, "_kadane": _kadane}
    encoded: dict[str, Any]
    try:
        exec(spec["reference_code"], namespace)
        reference = eval(spec["reference"], namespace)
        inputs = [eval(test, namespace) for test in spec["tests"]]
        expected = [reference(copy.deepcopy(value)) for value in inputs]
        encoded = {"inputs": [encode(value) for value in inputs], "expected": [encode(value) for value in expected]}
    except NotPlainData as exc:
        encoded = {"task_error": f"the task's inputs and answers must be plain data, found a {exc}"}
    except Exception as exc:
        encoded = {"task_error": f"{type(exc).__name__}: {exc}"}
    _emit(1, encoded)


# ---- the candidate run: the trusted parent ------------------------------------------------------------------------

RESULTS_LIMIT = 900_000  # bytes of results relayed: the report must fit the server's 1 MB stdout cap
OUTPUT_LIMIT = 1 << 20  # bytes of the candidate's output read; then its pipe closes, so a flood cannot keep us busy
OUTPUT_TAIL = 2000  # bytes of the candidate's own output kept for the report's detail
LINE_LIMIT = 65536  # longer output lines are not scanned for forged verdicts
# What the candidate's process may report of itself, and what the parent sees (the caller rejects other kinds).
SUSPECT_KINDS = ("non_plain_result", "forged_verdict", "early_exit", "protocol", "tampering", "frame_inspection",
                 "object_graph", "signal", "proc_access", "tracer", "forbidden_syscall")
_VERDICT_KEYS = ("results", "task_error", "report", "passed", "verdict", "score", "reward")
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


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
        self.tail = b""
        self.line = b""
        self.skipping_line = False

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
                        self.scan_output(chunk + b"\n")
                    del partial[fd]
                elif fd == output_r:
                    self.scan_output(chunk)
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
                                 f"{self.last_output_line()}")
        else:
            self.suspect("early_exit", f"the candidate's process exited (status {os.WEXITSTATUS(status)}) after "
                                       f"{len(self.tests)} of {self.total} results")
            self.report("error", f"the program exited before all tests ran{self.last_output_line()}")

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

    def scan_output(self, chunk: bytes) -> None:
        """Keep the output's tail; flag lines shaped like a verdict (the example harness read one from stdout)."""
        self.tail = (self.tail + chunk)[-OUTPUT_TAIL:]
        *lines, rest = chunk.split(b"\n")
        for piece in lines:
            if not self.skipping_line:
                self.check_line(self.line + piece)
            self.line, self.skipping_line = b"", False
        if not self.skipping_line:
            self.line += rest
            if len(self.line) > LINE_LIMIT:
                self.line, self.skipping_line = b"", True

    def check_line(self, line: bytes) -> None:
        text = line.strip()
        if not text.startswith(b"{") or "forged_verdict" in self.suspects:
            return
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            import ast

            try:
                value = ast.literal_eval(text.decode("utf-8", "replace"))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return
        if type(value) is dict and any(key in value for key in _VERDICT_KEYS):
            self.suspect("forged_verdict", f"printed a verdict-like line: {text[:120].decode('utf-8', 'replace')}")

    def last_output_line(self) -> str:
        lines = self.tail.decode("utf-8", "replace").strip().splitlines()
        return f": {lines[-1][:300]}" if lines else ""

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


# ---- the candidate run: the confined child ------------------------------------------------------------------------


class _Decoy:
    """Bound to `want` and `expected` where the candidate is called (the example harness kept the answer there):
    returning it, or an item of it, is reading the harness's frame."""

    def __getitem__(self, key: object) -> _Decoy:
        return self


def _child(program: str, func_name: str, inputs: list, results_w: int, output_w: int) -> None:
    """Never returns: confine, run the program, call the function on each input, report each result on fd 3."""
    os.dup2(output_w, 1)
    os.dup2(output_w, 2)
    os.dup2(results_w, 3)  # over the run's own report pipe to the server, which we must not hold
    os.closerange(4, 1 << 16)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    write = os.write
    dumps = json.JSONEncoder(separators=(",", ":")).encode

    def send(*lines: str) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")
        while data:
            data = data[write(3, data):]

    try:
        _confine()
    except OSError as exc:
        send(dumps({"setup_error": f"cannot confine the candidate: {exc}"}))
        _leave(0)
    send(dumps({"ready": True}))
    reported: set[str] = set()

    def suspect(kind: str, detail: str) -> None:
        if kind not in reported:
            reported.add(kind)
            send(dumps({"suspect": [kind, detail]}))  # at once: a run that then times out still shows it

    main = types.ModuleType("__main__")
    filename = sys.modules["__main__"].__dict__.get("__file__") or "main.py"
    main.__dict__.update(__builtins__=builtins, __file__=filename)
    sys.modules["__main__"] = main
    linecache.cache[filename] = (len(program), None, program.splitlines(True), filename)
    watched = _Watched()
    sys.addaudithook(_audit_hook(suspect, {id(frame) for frame in _stack()}))
    try:
        exec(compile(program, filename, "exec"), main.__dict__)
        function = main.__dict__.get(func_name)
        if not callable(function):
            raise NameError(f"name {func_name!r} is not defined")
    except BaseException as exc:  # SystemExit too: the program ended before its function could be called
        send(dumps({"program_error": _describe(exc)}))
        _print_traceback(exc)
        _leave(1)
    watched.check(suspect)
    results = []  # sent together at the end: one wake-up of the parent, not one per test
    want = expected = _Decoy()  # noqa: F841 (read by frame inspection only)
    for value in inputs:
        try:
            got = function(value)
        except BaseException as exc:  # a test that raises, or calls sys.exit, fails that test only
            results.append(dumps({"raised": _describe(exc)}))
            continue
        if got is want:
            suspect("frame_inspection", "returned the decoy expected value from the harness's frame")
        try:
            results.append(dumps({"result": encode(got)}))
        except NotPlainData as exc:
            suspect("non_plain_result", f"returned a {exc}")
            results.append(dumps({"not_plain": str(exc)}))
        except (ValueError, RecursionError) as exc:  # nested too deep, an int too long for JSON
            results.append(dumps({"not_plain": f"{type(exc).__name__}: {str(exc)[:100]}"}))
    watched.check(suspect)
    send(*results, dumps({"done": True}))
    try:
        atexit._run_exitfuncs()  # as the interpreter would at exit; their output is the candidate's, not ours
    finally:
        _leave(0)


def _leave(code: int) -> NoReturn:
    os.closerange(0, 4)  # the parent sees the end now, not after the kernel has torn this process down
    os._exit(code)


class _Watched:
    """What the harness relies on in the candidate's process: rebinding any of it is tampering."""

    def __init__(self) -> None:
        self.namespaces = {"builtins": builtins.__dict__, "json": json.__dict__}
        self.before = {name: dict(space) for name, space in self.namespaces.items()}
        self.stdio = (sys.stdout, sys.stderr)

    def check(self, suspect: Callable[[str, str], None]) -> None:
        changed = [f"{module}.{name}" for module, space in self.namespaces.items()
                   for name, value in self.before[module].items() if space.get(name, self) is not value]
        if sys.stdout is not self.stdio[0] or sys.stderr is not self.stdio[1]:
            changed.append("sys.stdout/sys.stderr")
        if changed:
            suspect("tampering", "rebound " + ", ".join(changed[:5]))


def _audit_hook(suspect: Callable[[str, str], None], harness_frames: set[int]) -> Callable[[str, tuple], None]:
    """Flags what only an exploit does: reaching the harness's frames, searching the object graph, signalling,
    opening another process's /proc entries, installing a tracer.  Nothing is refused here (the filter and the
    kernel do that); an audit hook cannot be removed once added."""
    own_proc = (f"/proc/{os.getpid()}/", "/proc/self/", "/proc/thread-self/")

    def hook(event: str, args: tuple) -> None:
        try:
            if event == "sys._getframe" and id(args[0]) in harness_frames:
                suspect("frame_inspection", "sys._getframe reached the harness's frames")
            elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents"):
                suspect("object_graph", event)
            elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
                suspect("signal", event)
            elif event in ("sys.settrace", "sys.setprofile"):
                suspect("tracer", event)
            elif event == "open" and type(args[0]) in (str, bytes):
                path = os.fsdecode(args[0])
                if path.startswith("/proc/") and not path.startswith(own_proc) and path[6:7].isdigit():
                    suspect("proc_access", f"opened {path[:60]}")
        except Exception:  # a hook that raises would fail the audited call instead
            pass

    return hook


def _stack() -> list:
    frames = []
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _describe(exc: BaseException) -> str:
    """`Type: message`, the traceback's last line; the message is the candidate's code, so it may fail too."""
    try:
        text = str(exc)
    except BaseException:
        text = ""
    name = _type_name(type(exc))
    return (f"{name}: {text}" if text else name)[:500]


def _print_traceback(exc: BaseException) -> None:
    try:
        import traceback

        traceback.print_exception(exc)
    except BaseException:  # best effort: it only feeds the report's output tail
        pass


# ---- seccomp --------------------------------------------------------------------------------------------------------

_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000
_EPERM = 1
# machine -> (AUDIT_ARCH, calls that read or trace another process: the child dies, calls a function under test
# has no use for: EPERM).  Killing is the telemetry: only an exploit makes those calls here.
_SYSCALLS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]] = {
    # ptrace, process_vm_readv, process_vm_writev, kcmp, pidfd_getfd | clone, fork, vfork, execve, kill, tkill,
    # tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, execveat, pidfd_send_signal, pidfd_open, clone3
    "x86_64": (0xC000003E, (101, 310, 311, 312, 438), (56, 57, 58, 59, 62, 200, 234, 129, 297, 322, 424, 434, 435)),
    # ptrace, process_vm_readv, process_vm_writev, kcmp, pidfd_getfd | clone, execve, kill, tkill, tgkill,
    # rt_sigqueueinfo, rt_tgsigqueueinfo, execveat, pidfd_send_signal, pidfd_open, clone3
    "aarch64": (0xC00000B7, (117, 270, 271, 272, 438), (220, 221, 129, 130, 131, 138, 240, 281, 424, 434, 435)),
}


def _seccomp_filter(machine: str) -> bytes:
    """A classic BPF program: wrong architecture (or x32) -> kill, listed calls -> kill or EPERM, else allow."""
    if machine not in _SYSCALLS:
        raise OSError(f"no seccomp filter for {machine}")
    arch, killed, refused = _SYSCALLS[machine]

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [op(load, 4), op(jeq, arch, 1, 0), op(ret, _SECCOMP_RET_KILL_PROCESS), op(load, 0)]
    if machine == "x86_64":
        program += [op(jge, 0x40000000, 0, 1), op(ret, _SECCOMP_RET_KILL_PROCESS)]
    for number in killed:
        program += [op(jeq, number, 0, 1), op(ret, _SECCOMP_RET_KILL_PROCESS)]
    for number in refused:
        program += [op(jeq, number, 0, 1), op(ret, _SECCOMP_RET_ERRNO | _EPERM)]
    program.append(op(ret, _SECCOMP_RET_ALLOW))
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _prctl(option: int, arg2: int, arg3: int = 0) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(option, arg2, arg3, 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"prctl({option}): {os.strerror(number)}")


def _confine() -> None:
    """no_new_privs, then the filter: from here on this process can neither reach another nor start one."""
    program = _seccomp_filter(os.uname().machine)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
