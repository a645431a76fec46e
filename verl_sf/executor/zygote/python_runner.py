"""Python code run as `python main.py` would run it: in a fresh `__main__`, with unbuffered stdio,
exit codes from SystemExit, tracebacks as CPython prints them, and atexit handlers at the end."""

from __future__ import annotations

import atexit
import contextlib
import io
import linecache
import os
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, TextIO

Streams = tuple[TextIO, TextIO, TextIO]


def make_stdio() -> Streams:
    """Unbuffered text streams on fds 0-2: a killed run still shows its partial output."""
    return (io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace"),
            io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             write_through=True),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             write_through=True))


def stdio_for_runs() -> Streams:
    """The streams of every python run, built once in the zygote.  They are built over what a
    run has on fds 0-2 (a memfd, then pipes), so they report the same seekability."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    stdin_fd = os.memfd_create("stdin", 0)
    out_r, out_w = os.pipe()
    for fd, target in ((stdin_fd, 0), (out_w, 1), (out_w, 2)):
        os.dup2(fd, target)
    try:
        return make_stdio()
    finally:
        for fd, target in zip(saved, (0, 1, 2), strict=True):
            os.dup2(fd, target)
        for fd in (*saved, stdin_fd, out_r, out_w):
            os.close(fd)


def install_stdio(streams: Streams) -> None:
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc,assignment]


def main_namespace(cwd: str) -> dict[str, Any]:
    """As `python main.py` sets them up (the path joined by hand: os.path touches more pages)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    main.__dict__["__file__"] = cwd + "/main.py"
    sys.path[0:0] = [cwd]
    return main.__dict__


def finish(code: int) -> int:
    """What the interpreter does at exit: join threads, run atexit handlers, flush."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:  # only a run that imported it can have threads
            threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):  # as CPython exits: a status past a C long is -1
        return code & 0xFF if -(1 << 63) <= code < (1 << 63) else 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def run_python(code: str, namespace: dict[str, Any], at_exit: bool = True) -> int:
    """Run `code` in `namespace`; its exit code.  `at_exit`: as the whole program (a run), not one
    call of a session."""
    filename = namespace["__file__"]  # absolute, as `python main.py` shows it in tracebacks
    cache_source(filename, code)
    done: Callable[[int], int] = finish if at_exit else (lambda result: result)
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as exc:
        return done(_exit_code(exc))
    except BaseException as exc:
        with contextlib.suppress(Exception):  # as CPython, which loses the traceback when the code broke sys.stderr
            sys.stderr.write("".join(user_traceback(exc)))
        return done(1)
    return done(0)


def cache_source(name: str, source: str) -> None:
    """The code's lines as linecache reads a file's: each ends with a newline, which the
    traceback's carets are placed by."""
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[name] = (len(source), None, lines, name)


def user_traceback(exc: BaseException) -> list[str]:
    """The traceback as `python main.py` prints it, chained exceptions and CPython's "Did you
    mean" hints included (they need the frames), without the outer frames of the zygote's own
    modules that ran the code."""
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    while report.stack and _is_ours(report.stack[0].filename):
        del report.stack[0]
    lines = list(report.format())
    if isinstance(exc, (NameError, AttributeError)):
        own = next(report.format_exception_only())
        hinted = _hinted_line(exc, own)
        if hinted is not None and own in lines:
            lines[len(lines) - 1 - lines[::-1].index(own)] = hinted
    return lines


_OUR_DIRECTORY = os.path.dirname(os.path.abspath(__file__)) + "/"


def _is_ours(filename: str) -> bool:
    return filename.startswith(_OUR_DIRECTORY)


def _hinted_line(exc: BaseException, own: str) -> str | None:
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
