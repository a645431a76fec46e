"""A server's own directory under $TMPDIR (the sandboxes' /etc copy, workdirs without isolation).

It holds a lock for the server's life, so a server killed without cleaning up (SIGKILL, the OOM
killer) leaves a directory the next server can tell from a live one's, in any PID namespace:
the next server to start removes every such directory of its own uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile

from verl_sf.executor.zygote.trees import remove_tree

PREFIX = "verl-sf-"
LOCK = ".owner"  # named only once locked: a server sweeping never takes a new directory's lock


class StateDir:
    """Create with `StateDir()`; `path` is the directory; `close()` removes it."""

    def __init__(self) -> None:
        sweep_stale()
        self.path = tempfile.mkdtemp(prefix=PREFIX)
        if os.geteuid() == 0:  # runs have uids of their own to reach it with; an account's runs are its uid
            os.chmod(self.path, 0o755)  # (0700: a file a run leaves setuid there is no other user's to run)
        unnamed = os.path.join(self.path, LOCK + ".new")
        self._lock_fd = os.open(unnamed, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(unnamed, os.path.join(self.path, LOCK))

    def close(self) -> None:
        remove(self.path)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def sweep_stale(parent: str = "") -> None:
    """Remove the directories of dead servers of this uid: `verl-sf-*` whose lock nobody holds."""
    parent = parent or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not a server's (no lock), or gone meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            remove(path)
        except BlockingIOError:
            pass  # its server is alive
        finally:
            os.close(fd)


def remove(path: str) -> None:
    """Remove a server's directory, however deep the trees its runs left there; what cannot be
    removed stays (the next server's sweep tries again)."""
    with contextlib.suppress(OSError):
        remove_tree(path)
