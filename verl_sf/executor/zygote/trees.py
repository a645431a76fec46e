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
from typing import Optional

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeMoved(OSError):
    """A directory the walk was in was moved out of the tree meanwhile (only a live tree's run can)."""


def walk(top: int, enter: Callable[[int, str], Optional[int]], leave: Callable[[int, str], None]) -> None:
    """Every entry below the directory `top` (left open), depth first: `enter(directory, name)` for
    each; where it answers a descriptor of that directory (opened with DIRECTORY, to go into; the
    walk closes it), that directory's entries, then `leave(directory, name)` from the directory that
    holds it.  Each climb checks it reached the directory it came from, else raises TreeMoved (a live
    tree's run moved it: '..' would go on outside the tree)."""
    here = os.open(".", DIRECTORY, dir_fd=top)
    pending = [os.listdir(here)]
    path: list[tuple[str, tuple[int, int]]] = []  # each directory gone into, and the one holding it
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                inner = enter(here, name)
                if inner is not None:
                    path.append((name, _identity(here)))
                    os.close(here)
                    here = inner
                    pending.append(os.listdir(here))
                continue
            pending.pop()
            if path:
                name, holder = path.pop()
                # back to the top by its own descriptor: '..' of a directory whose parent has a mount on
                # it (a fork's tree, walked from under its copy's tmpfs) lands in that mount
                outer = os.open("..", DIRECTORY, dir_fd=here) if path else os.open(".", DIRECTORY, dir_fd=top)
                os.close(here)
                here = outer
                if _identity(here) != holder:
                    raise TreeMoved(f"{name!r} was moved while it was walked")
                leave(here, name)
    finally:
        os.close(here)


def _identity(directory: int) -> tuple[int, int]:
    info = os.fstat(directory)
    return info.st_dev, info.st_ino


def remove_tree(path: str) -> None:
    """Remove the directory `path` and everything in it (gone already is fine).  A directory its run
    made unreadable is opened up first (ours, or root's to change)."""
    try:
        top = _open_up(path)
    except FileNotFoundError:
        return

    def enter(directory: int, name: str) -> Optional[int]:
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        if not stat.S_ISDIR(mode):
            os.unlink(name, dir_fd=directory)
            return None
        if mode & 0o700 != 0o700:
            os.chmod(name, 0o700, dir_fd=directory)  # a directory (lstat above): nothing to follow
        return os.open(name, DIRECTORY, dir_fd=directory)

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
