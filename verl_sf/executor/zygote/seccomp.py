"""The runs' seccomp filter: compiled once by libseccomp, loaded by each child with one prctl
(compiling per run would cost far more than the fork).  It fails closed: a listed call the
library cannot name is taken by number or refused at start, and calls newer than its table are
refused as missing (ENOSYS, so runtimes fall back).

clone with namespace flags is handed to the process's tracer (SECCOMP_RET_TRACE) and made only if
a tracer that asked for those events (PTRACE_O_TRACESECCOMP) lets it go on; without one the kernel
answers ENOSYS.  The one such tracer is the forker of a session (forker.py), which has the session's
only thread stopped and makes the call itself: no run may ask for those events (ptrace with that
option is refused), so no secret, nothing a run could read, admits a namespace."""

from __future__ import annotations

import ctypes
import errno
import os
import traceback
from typing import Optional

from .linux import NAMESPACE_FLAGS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, check, libc
from .messages import ZygoteConfig

SCMP_ERROR = -1  # __NR_SCMP_ERROR: libseccomp does not know the name
SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_TRACE = 0x7FFF0000, 0x00050000, 0x7FF00000
SCMP_FLTATR_CTL_OPTIMIZE, SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 8, 1, 4, 7
# ptrace requests that set options (PTRACE_OLDSETOPTIONS is x86's old number), and the option a run may not set.
PTRACE_OPTION_REQUESTS = (0x4200, 0x4206, 21)  # PTRACE_SETOPTIONS, PTRACE_SEIZE, PTRACE_OLDSETOPTIONS
PTRACE_O_TRACESECCOMP = 0x80
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
    """The compiled program, read into the zygote once: its children inherit it, so a child loads
    it with one prctl (reading it in each child cost ~120 page copies).  None: no filter."""

    def __init__(self, program: Optional[bytes]):
        self._address: Optional[ctypes.c_void_p] = None
        if program:
            self._buffer = ctypes.create_string_buffer(program, len(program))
            self._fprog = _SockFprog(len(program) // 8, ctypes.cast(self._buffer, ctypes.c_char_p))
            self._address = ctypes.c_void_p(ctypes.addressof(self._fprog))

    def load(self) -> None:
        """The filter (no_new_privs first; an exec keeps both)."""
        if self._address is not None:
            check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._address, 0, 0), "seccomp")


def compiled_filter(config: ZygoteConfig) -> Filter:
    """Compiled in a throwaway child (libseccomp stays out of the zygote, whose every page its
    children inherit); the program comes back through a memfd."""
    if not config["seccomp"]:
        return Filter(None)
    program_fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.write(program_fd, compile_filter(config))
                os._exit(0)
            except BaseException:
                os.write(2, traceback.format_exc().encode())
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise OSError("the seccomp filter could not be compiled (see the message above)")
        return Filter(os.pread(program_fd, os.fstat(program_fd).st_size, 0))
    finally:
        os.close(program_fd)


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
        for family, protocol in config["seccomp_sockets"]:
            only = [_ArgCmp(2, SCMP_CMP_EQ, protocol, 0)] if protocol >= 0 else []
            rule(eperm, number_of("socket"), _ArgCmp(0, SCMP_CMP_EQ, family, 0), *only)
        for name, refusals in config["seccomp_self_only"].items():  # another process: EPERM
            for pairs in refusals:
                rule(eperm, number_of(name), *(_ArgCmp(index, SCMP_CMP_NE, value, 0) for index, value in pairs))
        for flag in NAMESPACE_FLAGS:  # made only if the forker, tracing, lets it go on
            rule(SCMP_ACT_TRACE, number_of("clone"), _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        for request in PTRACE_OPTION_REQUESTS:  # no run becomes such a tracer
            rule(eperm, number_of("ptrace"), _ArgCmp(0, SCMP_CMP_EQ, request, 0),
                 _ArgCmp(3, SCMP_CMP_MASKED_EQ, PTRACE_O_TRACESECCOMP, PTRACE_O_TRACESECCOMP))
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
