"""The runs' seccomp filter: compiled once by libseccomp, loaded by each child with one prctl
(compiling per run would cost far more than the fork).  It fails closed: a listed call the
library cannot name is taken by number or refused at start, and calls newer than its table are
refused as missing (ENOSYS, so runtimes fall back)."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Optional

from .linux import NAMESPACE_FLAGS, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, check, libc
from .messages import ZygoteConfig

SCMP_ERROR = -1  # __NR_SCMP_ERROR: libseccomp does not know the name
SCMP_ACT_ALLOW, SCMP_ACT_ERRNO = 0x7FFF0000, 0x00050000
SCMP_FLTATR_CTL_OPTIMIZE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 8, 4, 7
# System calls added since 5.1 have one number on every architecture; these are the ones an
# older libseccomp may not resolve.  Everything from FIRST_UNKNOWN_SYSCALL on is refused.
NEW_SYSCALLS = {"memfd_secret": 447, "cachestat": 451, "fchmodat2": 452, "map_shadow_stack": 453,
                "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456, "statmount": 457, "listmount": 458,
                "lsm_get_self_attr": 459, "lsm_set_self_attr": 460, "lsm_list_modules": 461, "mseal": 462}
FIRST_UNKNOWN_SYSCALL = 463
UNKNOWN_SYSCALLS_REFUSED = 128


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class Filter:
    """The compiled program, held where a child only hands its address to prctl."""

    def __init__(self, program: bytes):
        self._buffer = ctypes.create_string_buffer(program, len(program) or 1)
        self._fprog = _SockFprog(len(program) // 8, ctypes.cast(self._buffer, ctypes.c_char_p))
        self.address: Optional[ctypes.c_void_p] = ctypes.c_void_p(ctypes.addressof(self._fprog)) if program else None

    def load(self) -> None:
        """no_new_privs, then the filter (an exec keeps both)."""
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if self.address is not None:
            check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self.address, 0, 0), "seccomp")


def compile_filter(config: ZygoteConfig) -> bytes:
    """The filter as a BPF program (native ABI only: 32-bit and x32 calls hit the bad-arch kill)."""
    lib = ctypes.CDLL(config["libseccomp"], use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    eperm, enosys = SCMP_ACT_ERRNO | errno.EPERM, SCMP_ACT_ERRNO | errno.ENOSYS
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    lib.seccomp_attr_set(ctypes.c_void_p(ctx), SCMP_FLTATR_CTL_OPTIMIZE, 2)  # a binary tree, not a list

    def number_of(name: str) -> int:
        number: int = lib.seccomp_syscall_resolve_name(name.encode())
        if number == SCMP_ERROR:  # newer than this libseccomp: the number every architecture shares
            known = NEW_SYSCALLS.get(name)
            if known is None:
                raise OSError(errno.EINVAL, f"seccomp: cannot resolve the system call {name!r}")
            number = known
        return number

    def rule(action: int, number: int, *compares: _ArgCmp) -> None:
        if number < 0:
            return  # a pseudo-number: not a system call on this architecture
        array = (_ArgCmp * max(1, len(compares)))(*compares)
        result = lib.seccomp_rule_add_array(ctx, action, number, len(compares), array)
        if result != 0:
            raise OSError(-result, f"seccomp rule for system call {number}: {os.strerror(-result)}")

    try:
        refused = {number_of(name) for name in config["seccomp"]}
        for number in refused:
            rule(eperm, number)
        rule(enosys, number_of("clone3"))  # its flags live in memory a filter cannot read; libc falls back to clone
        for number in range(FIRST_UNKNOWN_SYSCALL, FIRST_UNKNOWN_SYSCALL + UNKNOWN_SYSCALLS_REFUSED):
            if number not in refused:
                rule(enosys, number)
        for family in config["seccomp_socket_families"]:
            rule(eperm, number_of("socket"), _ArgCmp(0, SCMP_CMP_EQ, family, 0))
        for flag in NAMESPACE_FLAGS:
            rule(eperm, number_of("clone"), _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        exported = os.memfd_create("seccomp")
        try:
            result = lib.seccomp_export_bpf(ctx, exported)
            if result != 0:
                raise OSError(-result, f"seccomp_export_bpf: {os.strerror(-result)}")
            return os.pread(exported, os.fstat(exported).st_size, 0)
        finally:
            os.close(exported)
    finally:
        lib.seccomp_release(ctx)
