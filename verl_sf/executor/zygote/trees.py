"""Directory trees a run made, walked by descriptor: no symlink followed, no recursion, two descriptors.

A run can nest directories deeper than Python's recursion limit and than PATH_MAX (a `mkdir d;
cd d` loop), so whatever privileged code walks for it (removing a run's directory, copying a
session's files into its fork) goes down with `openat(name)` and back up with `openat("..")`,
holding one directory open at a time; each directory's names are listed once, as it is entered.
The trees walked here are still: their runs are dead, or stopped while they are copied.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk(top: int, enter: Callable[[int, str], bool], leave: Callable[[int, str], None]) -> None:
    """Every entry below the directory `top` (left open), depth first: `enter(directory, name)` for
    each; where it answers True (a directory to go into), that directory's entries, then
    `leave(directory, name)` from the directory that holds it."""
    here = os.open(".", DIRECTORY, dir_fd=top)
    pending = [os.listdir(here)]
    path: list[str] = []
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                if enter(here, name):
                    inner = os.open(name, DIRECTORY, dir_fd=here)
                    os.close(here)
                    here = inner
                    path.append(name)
                    pending.append(os.listdir(here))
                continue
            pending.pop()
            if path:
                outer = os.open("..", DIRECTORY, dir_fd=here)
                os.close(here)
                here = outer
                leave(here, path.pop())
    finally:
        os.close(here)


def remove_tree(path: str) -> None:
    """Remove the directory `path` and everything in it (gone already is fine).  A directory its run
    made unreadable is opened up first (ours, or root's to change)."""
    try:
        top = _open_up(path)
    except FileNotFoundError:
        return

    def enter(directory: int, name: str) -> bool:
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        if not stat.S_ISDIR(mode):
            os.unlink(name, dir_fd=directory)
            return False
        if mode & 0o700 != 0o700:
            os.chmod(name, 0o700, dir_fd=directory)  # a directory (lstat above): nothing to follow
        return True

    try:
        walk(top, enter, lambda directory, name: os.rmdir(name, dir_fd=directory))
    finally:
        os.close(top)
    os.rmdir(path)


def _open_up(path: str) -> int:
    try:
        return os.open(path, DIRECTORY)
    except PermissionError:
        os.chmod(path, 0o700)  # the run's own directory, which only its parent (ours) could replace
        return os.open(path, DIRECTORY)
