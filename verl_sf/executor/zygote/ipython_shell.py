"""The IPython shell that runs cells, as a Jupyter kernel's does: IPython's input transforms
(indented cells, `!cmd`, magics, top-level `await`), its display formatter and its tracebacks.

The only module of the zygote that imports IPython, and only inside its functions: a zygote of a
cells flavor builds the shell while it warms up (every forked cell run then starts with it
ready); elsewhere, the first cell of a session builds it.  What the shell shows is collected per
cell in `Outputs` instead of written to a terminal.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import io
import json
import os
import re
import sys
import types
from collections.abc import Iterator
from typing import Any, Optional

from .wire import MAX_DEPTH, bulk_of, deeper_than

BUNDLE_DEPTH = MAX_DEPTH - 10  # room for the records (and the E2B events) a bundle travels in
NO_NETWORK = ("{what} cannot install packages here: the sandbox has no network. The packages of the "
              "server's Python are importable as they are")
INSTALLER_MAGICS = ("pip", "conda", "mamba", "micromamba", "uv")
# `!pip install x`, `!python -m pip install x`, `!uv pip install x`, `!apt-get install x`, ...
INSTALL_COMMAND = re.compile(r"^\s*(?:sudo\s+)?(?:\S*/)?(?:pip3?(?:\.\d+)?|python3?(?:\.\d+)?\s+-m\s+pip|"
                             r"conda|mamba|micromamba|uv(?:\s+pip)?|apt(?:-get)?)\s+install\b")


PREPARE_CELL = "_prepare = [i for i in range(3)]\nprint(end='')\ndel _prepare\n[0]"
"""What a forked child runs before its job: what most cells do (a name bound, a comprehension, a
print of nothing, a value shown), so that their copy-on-write faults are paid off the request's path."""


def figures_display() -> list[dict[str, object]]:
    """Open matplotlib figures, as inline PNGs (what a Jupyter kernel shows after a cell), then closed:
    after a cell run, and after an E2B execution (before its note, which must come last)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    shown: list[dict[str, object]] = []
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        buffer = io.BytesIO()
        with contextlib.suppress(Exception):
            figure.savefig(buffer, format="png")
            shown.append({"image/png": base64.b64encode(buffer.getvalue()).decode(),
                          "text/plain": repr(figure)})
    pyplot.close("all")
    return shown


class Outputs:
    """What the running cell displayed (MIME bundles, in order) and the error it ended with."""

    def __init__(self) -> None:
        self.display: list[dict[str, object]] = []
        self.error: list[dict[str, object]] = []


current = Outputs()
_shell: Optional[Any] = None


def warm() -> None:
    """Import IPython and build the shell (in a zygote: before its heap is frozen).  Without
    IPython in the runtime this leaves no shell; each cell then says so."""
    global _shell
    if _shell is None:
        with _main_kept(), contextlib.suppress(ImportError):
            _shell = _build()


@contextlib.contextmanager
def _main_kept() -> Iterator[None]:
    """`__main__` as it was before: building the shell or running a scratch cell binds a module of
    their own, and a later `shell_for` must find the job's, whose dict is the namespace that its
    cells, and a session's code, share across calls."""
    main = sys.modules.get("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def shell_for(namespace: dict[str, Any]) -> Any:
    """The shell, running its cells in `namespace` (the run's or session's `__main__`: a module's
    dict is shared with its code as it is; any other dict is copied into a module of its own)."""
    warm()
    if _shell is None:
        raise ImportError("IPython is not installed in the sandbox's Python: cells need it "
                          "(pip install ipython into the runtime the server runs code with)")
    if _shell.user_ns is not namespace:
        module = sys.modules.get("__main__")
        if not isinstance(module, types.ModuleType) or module.__dict__ is not namespace:
            module = types.ModuleType("__main__")
            module.__dict__.update(namespace)
        bind(_shell, module)
    return _shell


def prepare(namespace: dict[str, Any]) -> None:
    """In a forked child before its job comes: bind the shell and run an empty cell.  The first
    cell of a fork writes to thousands of pages it shares with the zygote (IPython's objects), and
    their copy-on-write faults cost milliseconds; paid here, they are off the request's path."""
    with contextlib.suppress(ImportError):
        with _main_kept():
            shell_for({"__name__": "__main__"}).run_cell(PREPARE_CELL, store_history=False)  # a scratch namespace
        _forget(_shell)
        shell_for(namespace)


def bind(shell: Any, module: types.ModuleType) -> None:
    """Cells from now on run in `module`'s namespace (a kernel's `__main__`)."""
    shell.user_module, shell.user_ns = module, module.__dict__
    shell.ns_table.update(user_global=module.__dict__, user_local=module.__dict__)
    sys.modules["__main__"] = module
    shell.init_user_ns()


def mime_bundle(format_dict: dict[str, Any]) -> dict[str, object]:
    """A bundle as a kernel sends it: binary images base64-encoded, JSON as it is, the rest text.
    JSON nested past BUNDLE_DEPTH, or too bulky to parse cheaply (`wire.bulk_of`), is left out (its
    text/plain stays): the record around it could not reach the zygote."""
    bundle: dict[str, object] = {}
    for mime, value in format_dict.items():
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        elif not isinstance(value, (str, dict, list)):
            value = json.loads(json.dumps(value, default=str))
        if deeper_than(value, BUNDLE_DEPTH) or isinstance(value, (dict, list)) and bulk_of(json.dumps(value)):
            continue
        bundle[mime] = value
    return bundle


def _build() -> Any:
    import subprocess  # here: it imports `threading`, which the other flavors keep out (warmup.py)

    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class CellDisplayHook(DisplayHook):
        """The value of a cell's last expression, formatted by IPython, kept for the cell's record;
        `main_index` says where (E2B marks it as the execution's result)."""

        main_index: Optional[int] = None

        def start_displayhook(self) -> None:
            pass

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: dict[str, Any], md_dict: Optional[dict[str, Any]] = None) -> None:
            self.main_index = len(current.display)
            current.display.append(mime_bundle(format_dict))

        def finish_displayhook(self) -> None:
            pass

    class CellDisplayPublisher(DisplayPublisher):
        """`display(...)` calls, in order."""

        def publish(self, data: dict[str, Any], metadata: Any = None, source: Any = None, *, transient: Any = None,
                    update: bool = False, **kwargs: Any) -> None:
            current.display.append(mime_bundle(data))

    class CellShell(InteractiveShell):
        """Errors go to the cell's record as a kernel sends them (ename, evalue, the traceback's lines)."""

        displayhook_class = CellDisplayHook
        display_pub_class = CellDisplayPublisher

        def system(self, cmd: str) -> None:
            """`!cmd`, as IPython's `system_raw` runs it (the cell's fds 1 and 2 are its output), except
            package installs, which cannot reach a network here."""
            cmd = self.var_expand(cmd, depth=1)
            if INSTALL_COMMAND.match(cmd):
                print(NO_NETWORK.format(what=cmd.split()[0]), file=sys.stderr)
                self.user_ns["_exit_code"] = 1
                return
            try:
                code = subprocess.call(cmd, shell=True, executable=os.environ.get("SHELL"))
            except KeyboardInterrupt:
                print("\n" + self.get_exception_only(), file=sys.stderr)
                code = -2
            self.user_ns["_exit_code"] = -(code - 128) if code > 128 else code

        def ask_exit(self) -> None:  # `exit()`: a kernel's shell asks its front end; here the cells go on
            self.exit_now = True

        def show_usage_error(self, exc: BaseException) -> None:
            super().show_usage_error(exc)
            current.error.append({"ename": type(exc).__name__, "evalue": str(exc), "traceback": []})

        def showtraceback(self, exc_tuple: Any = None, *args: Any, **kwargs: Any) -> None:
            """As IPython's, and where it cannot format the error (code broke what formatting
            needs), the error still ends the cell: its name and value, with no traceback."""
            etype, evalue = (exc_tuple or sys.exc_info())[:2]  # not its traceback: no frame is kept by this one
            shown = len(current.error)
            try:
                super().showtraceback(exc_tuple, *args, **kwargs)
            finally:
                if len(current.error) == shown and etype is not None:
                    current.error.append({"ename": etype.__name__, "evalue": str(evalue), "traceback": []})

        def _showtraceback(self, etype: type[BaseException], evalue: BaseException, stb: list[str]) -> None:
            current.error.append({"ename": etype.__name__, "evalue": str(evalue), "traceback": list(stb)})

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite file, no saving thread
    config.InteractiveShell.colors = "nocolor"
    ipython_dir = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".ipython")
    shell = CellShell.instance(config=config, ipython_dir=ipython_dir)
    # Its exit handler closes history and deletes %edit's temporary files (neither exists here):
    # a run would pay milliseconds for it as it ends.
    atexit.unregister(shell.atexit_operations)

    def no_network(line: str) -> None:
        raise UsageError(NO_NETWORK.format(what="this magic"))

    for name in INSTALLER_MAGICS:
        shell.magics_manager.register_function(no_network, "line", name)

    # The first cell fills IPython's caches; one with a value also builds the display formatters (a
    # dozen traitlets objects), which every forked cell would otherwise build again.  Its record goes.
    shell.run_cell("1", store_history=False)
    _forget(shell)
    return shell


def _forget(shell: Any) -> None:
    """What a warm-up cell left in the shell, so the job's first cell finds it as a fresh kernel's: the
    display hook's last values (`_`, `__`, `___`), the output history (`Out`) and the cell's record."""
    hook = shell.displayhook
    hook._ = hook.__ = hook.___ = ""
    shell.history_manager.output_hist.clear()
    current.display.clear()
