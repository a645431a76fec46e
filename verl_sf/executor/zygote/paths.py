"""Paths a request names, opened by the job itself (as its user), strictly beneath its own
directories and never through a symlink: what the server writes or fetches for a job can never
be steered elsewhere by a path the job planted."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import os
import stat
from typing import Optional

from .linux import RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, SYS_OPENAT2, OpenHow, libc

RUN_TMP = ".tmp"
"""Without a view of its own (the landlock rung) a run's TMPDIR: this entry of its working directory."""


def split_path(path: str, roots: list[str]) -> tuple[str, list[str]]:
    """(root, components beneath it) of a request's path, or ValueError: absolute paths must be
    under one of `roots`, relative ones are in the first."""
    if path.startswith("/"):
        for root in roots:
            if path == root or path.startswith(root.rstrip("/") + "/"):
                rest = path[len(root):].lstrip("/")
                break
        else:
            raise ValueError(f"path {path!r} is outside the run's directories")
        base = root
    else:
        base, rest = roots[0], path
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or "\x00" in path:
        raise ValueError(f"path {path!r} must name a file beneath {base} without '..'")
    return base, parts


def open_beneath(path: str, flags: int, roots: list[str], mode: int = 0o644) -> int:
    """open(2) of `path` strictly beneath its root, no symlink followed at any component:
    openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a walk one O_NOFOLLOW component at a
    time where the kernel lacks openat2."""
    base, parts = split_path(path, roots)
    root = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        how = OpenHow(flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode if flags & os.O_CREAT else 0,
                      RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        fd: int = libc.syscall(SYS_OPENAT2, root, "/".join(parts).encode(), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err), path)
        directory = os.dup(root)
        for part in parts[:-1]:
            try:
                following = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            finally:
                os.close(directory)
            directory = following
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
        finally:
            os.close(directory)
    finally:
        os.close(root)


class UnwritableFile(Exception):
    def __init__(self, path: str, cause: Exception):
        super().__init__(f"could not write file {path!r}: {cause}")


def write_files(files: dict[str, str], roots: list[str]) -> None:
    """The request's files (path -> base64), written beneath `roots`; UnwritableFile on the first that cannot be."""
    for path, content in files.items():
        try:
            base, parts = split_path(path, roots)
            directory = base
            for part in parts[:-1]:
                directory = f"{directory}/{part}"
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory)
            fd = open_beneath(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, roots)
            with os.fdopen(fd, "wb") as fh:
                fh.write(base64.b64decode(content or ""))
        except (OSError, ValueError) as exc:
            raise UnwritableFile(path, exc) from exc


def fetch(paths: Optional[list[str]], roots: list[str], limit: int) -> dict[str, str]:
    """The requested files, base64.  A file named twice (`big`, `./big`, `/workdir/big`) is read
    once, under its first name; all files together stay within `limit` bytes; files that are
    missing, unsafe to open or past the limit are left out (as Sandbox Fusion leaves out missing ones)."""
    fetched = {}
    seen = set()
    room = limit
    for path in paths or ():
        try:  # non-blocking: a FIFO must not hold the reply until its time-out
            fd = open_beneath(path, os.O_RDONLY | os.O_NONBLOCK, roots)
        except (OSError, ValueError):
            continue
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen or info.st_size > room:
            os.close(fd)  # only regular files: a directory, FIFO or device is left out
            continue
        seen.add((info.st_dev, info.st_ino))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(room + 1)
        if len(data) <= room:
            fetched[path] = base64.b64encode(data).decode()
            room -= len(data)
    return fetched
