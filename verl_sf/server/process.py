"""Start and stop `verl-sf serve` as a child process (tests, benchmarks, scripts).

`--port 0` lets the kernel pick a free port; the server prints the URL it bound, and this is
the one place that reads it.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Optional

LISTEN_RE = re.compile(r"listening on (http://[\w.\-\[\]:]+)")
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: Optional[int] = None) -> None:
    """SIGTERM this process when the thread that forked it exits, so a killed supervisor (a node
    actor, the fronts' parent) never leaves a server holding the node's port and cores.  With
    `parent_pid`, exit at once if that parent is already gone."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def start_server_process(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 120.0,
                         preexec_fn: Optional[Callable[[], None]] = None, host: str = "127.0.0.1",
                         port: int = 0, user: Optional[str] = None, stderr: Optional[IO[str]] = None,
                         checkout: Optional[str] = None) -> tuple[subprocess.Popen, str]:
    """Run `verl-sf serve --host HOST --port PORT *args`; return the process and its base URL.

    `user` (an account name; needs root) starts the server as that account, with its primary
    group only, as an ordinary user would.  `checkout`: serve that checkout's `verl_sf` rather than
    the installed one (a benchmark's baseline): run there, with it first on PYTHONPATH."""
    cmd = [sys.executable, "-m", "verl_sf.cli", "serve", "--host", host, "--port", str(port), *args]
    identity: dict[str, Any] = {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []} if user else {}
    env = dict(env or os.environ)
    cwd = os.path.abspath(checkout) if checkout else None
    if cwd:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (cwd, env.get("PYTHONPATH"))))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=preexec_fn, stderr=stderr, cwd=cwd, **identity)
    lines = _lines_until_listening(proc)
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            stop_server_process(proc)
            raise RuntimeError(f"verl-sf serve did not start within {timeout:g} s") from None
        if not line:
            raise RuntimeError(f"verl-sf serve exited with {proc.wait()} before listening")
        match = LISTEN_RE.search(line)
        if match:
            return proc, match.group(1)


def _lines_until_listening(proc: subprocess.Popen) -> queue.Queue[str]:
    """The server's stdout lines up to the one that names its URL ("" at EOF), read in a thread:
    a blocking readline would hold the caller past its deadline while the server prints nothing."""
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stdout:
            lines.put(line)
            if LISTEN_RE.search(line):
                return
        lines.put("")

    threading.Thread(target=read, name=f"verl-sf serve {proc.pid} stdout", daemon=True).start()
    return lines


def stop_server_process(proc: subprocess.Popen) -> None:
    """SIGTERM (the server shuts its sandboxes down), SIGKILL to the group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
