"""The candidate run's confined child: it keeps none of the run's descriptors, loads the seccomp filter, and only
then compiles the candidate's program and calls its function on each input, reporting each result on fd 3."""

from __future__ import annotations

import atexit
import builtins
import json
import linecache
import os
import sys
import types
from collections.abc import Callable
from typing import NoReturn, Optional

from .codec import NotPlainData, _type_name, encode
from .confinement import _confine


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
