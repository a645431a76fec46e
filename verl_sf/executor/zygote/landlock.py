"""Landlock for one run: a filesystem allow-list (read and execute the system and runtimes, write
only the run's own directory), no TCP bind or connect, and, from ABI 6, signals and abstract unix
sockets scoped to the run's own domain (so not the server, not the zygote, not another run).
Each child builds its own ruleset: a ruleset shared through a forked descriptor would collect
every child's rules."""

from __future__ import annotations

import contextlib
import ctypes
import os

from .linux import check, libc
from .messages import LandlockConfig

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
RULE_PATH_BENEATH = 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
READ_ONLY = EXECUTE | READ_FILE | READ_DIR
DEVICE = READ_FILE | WRITE_FILE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def handled_fs(abi: int) -> int:
    """Every filesystem right the kernel's ABI knows: a right not handled would be allowed."""
    rights = (1 << 13) - 1  # ABI 1: execute ... make_sym
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def ruleset(config: LandlockConfig, writable: str) -> int:
    """The run's ruleset, built while its paths can still be opened (before the uid changes);
    paths missing or out of reach are left out (nothing beneath them is allowed)."""
    abi = config["abi"]
    everything = handled_fs(abi)
    attr = _RulesetAttr(everything, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    fd: int = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if fd < 0:
        check(-1, "landlock_create_ruleset")
    grants = [(path, READ_ONLY & everything) for path in config["read"]]
    grants += [(path, DEVICE) for path in config["devices"]]
    grants.append((writable, everything & ~IOCTL_DEV))
    for path, access in grants:
        with contextlib.suppress(FileNotFoundError, PermissionError):
            _allow(fd, path, access)
    return fd


def restrict(fd: int) -> None:
    """Enforce a ruleset on this process and all it starts (no_new_privs must be set)."""
    try:
        check(libc.syscall(SYS_RESTRICT_SELF, fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)


def _allow(ruleset: int, path: str, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # rights a file can carry
        rule = _PathBeneathAttr(access, fd)
        check(libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0), f"landlock rule {path}")
    finally:
        os.close(fd)
