"""Cells in one namespace, as a Jupyter kernel runs them: by IPython itself (ipython_shell.py),
each cell's output captured apart, what it displays in order, open matplotlib figures shown after
it, errors as the kernel reports them.  All cells together share the run's per-stream output limit."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import Any, Optional

from . import ipython_shell
from .messages import DISPLAYS_LEFT_OUT, TRUNCATION_MARKER, CellRecord, kept_displays
from .python_runner import finish, make_stdio, user_traceback
from .wire import bulk_of, dumps, report


def run_cells(cells: list[str], cell_timeout: float, output_limit: int, namespace: dict[str, Any],
              at_exit: bool = True) -> int:
    """Every cell writes into a memfd standing in for fds 1 and 2 (so output of subprocesses is
    caught too); after the cell its content is read, capped, reported on fd 3, and emptied."""
    saved = (os.dup(1), os.dup(2), sys.stdout, sys.stderr)
    captures = [os.memfd_create("cell-stdout"), os.memfd_create("cell-stderr")]
    os.dup2(captures[0], 1)
    os.dup2(captures[1], 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a flooding cell gets EFBIG, not death
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.stdout, sys.stderr = make_stdio()[1:]  # over the memfds: seekable, unlike a python run's pipes

    def _alarm(signum: int, frame: Optional[FrameType]) -> None:
        raise TimeoutError(f"cell exceeded cell_timeout of {cell_timeout} s")

    signal.signal(signal.SIGALRM, _alarm)
    room = [output_limit, output_limit]  # what is left of each stream's limit, over all cells
    driver = os.getpid()
    try:
        shell: Optional[Any] = ipython_shell.shell_for(namespace)
        missing = ""
    except ImportError as exc:
        shell, missing = None, str(exc)
    for source in cells:
        outputs = ipython_shell.current = ipython_shell.Outputs()
        if cell_timeout:
            signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            if shell is None:
                raise ModuleNotFoundError(missing)
            shell.displayhook.main_index = None
            shell.run_cell(source, store_history=True)
            outputs.display.extend(ipython_shell.figures_display())
        except BaseException as exc:  # noqa: B036 - a time-out outside the cell's own code lands here
            if not outputs.error:
                outputs.error.append({"ename": type(exc).__name__, "evalue": str(exc),
                                      "traceback": user_traceback(exc)})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() != driver:  # a copy the cell forked, back in the driver: the cells are the kernel's
            os._exit(0)
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
        record: CellRecord = {"kind": "cell", "stdout": texts[0], "stderr": texts[1], "display": outputs.display,
                              "error": outputs.error, "truncated": cut}
        bulk = bulk_of(dumps(record).decode()) if outputs.display else ""
        if bulk:  # the zygote would drop the whole record unread, and the cell with it
            main = shell.displayhook.main_index if shell is not None else None
            record["display"], record["truncated"] = kept_displays(outputs.display, 0, main), True
            if bulk_of(dumps(record).decode()):  # the result itself is the bulk
                record["display"] = kept_displays(outputs.display, 0, None)
            record["stderr"] += DISPLAYS_LEFT_OUT.format(count=len(outputs.display) - len(record["display"]), why=bulk)
        report(record)
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (*captures, saved[0], saved[1]):
        os.close(fd)
    sys.stdout, sys.stderr = saved[2], saved[3]
    return finish(0) if at_exit else 0
