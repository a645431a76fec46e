"""The zygote's entry point inside the sandbox: `python -I -c BOOTSTRAP CONFIG` (see sandbox.py)."""

from __future__ import annotations

import json
import signal
import sys

from .supervisor import Zygote


def main(config_fd: int, package_parent: str) -> None:
    with open(config_fd, "rb") as handle:  # closed: nothing forked from us holds it
        config = json.loads(handle.read())
    sys.argv = ["main.py"]  # as `python main.py` has it; set here, a run need not free ours
    if package_parent in sys.path:
        sys.path.remove(package_parent)  # runs import their own modules, never ours
    restore_signals()
    Zygote(config).serve()


def restore_signals() -> None:
    """Every run and session starts with the signals a fresh interpreter has, whatever the server
    inherited: a server started as a shell's background job (`verl-sf serve &`) has SIGINT and
    SIGQUIT ignored, and a session whose interpreter ignores SIGINT cannot be interrupted at its
    time-out.  Python's own choices (SIGPIPE, SIGXFSZ ignored) stay."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    kept = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP}
    for sig in signal.valid_signals() - kept:
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):  # real-time signals glibc reserves
            continue
