"""What the kernel enforces for the harness: `prctl` (the parent's undumpable flag), and the seccomp filter the
confined child loads before any candidate code exists."""

from __future__ import annotations

import ctypes
import os
import struct

PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000
_EPERM = 1
# machine -> (AUDIT_ARCH, calls that read or trace another process: the child dies, calls a function under test
# has no use for: EPERM).  Killing is the telemetry: only an exploit makes those calls here.
_SYSCALLS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]] = {
    # ptrace, process_vm_readv, process_vm_writev, kcmp, pidfd_getfd | clone, fork, vfork, execve, kill, tkill,
    # tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, execveat, pidfd_send_signal, pidfd_open, clone3
    "x86_64": (0xC000003E, (101, 310, 311, 312, 438), (56, 57, 58, 59, 62, 200, 234, 129, 297, 322, 424, 434, 435)),
    # ptrace, process_vm_readv, process_vm_writev, kcmp, pidfd_getfd | clone, execve, kill, tkill, tgkill,
    # rt_sigqueueinfo, rt_tgsigqueueinfo, execveat, pidfd_send_signal, pidfd_open, clone3
    "aarch64": (0xC00000B7, (117, 270, 271, 272, 438), (220, 221, 129, 130, 131, 138, 240, 281, 424, 434, 435)),
}


def _seccomp_filter(machine: str) -> bytes:
    """A classic BPF program: wrong architecture (or x32) -> kill, listed calls -> kill or EPERM, else allow."""
    if machine not in _SYSCALLS:
        raise OSError(f"no seccomp filter for {machine}")
    arch, killed, refused = _SYSCALLS[machine]

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [op(load, 4), op(jeq, arch, 1, 0), op(ret, _SECCOMP_RET_KILL_PROCESS), op(load, 0)]
    if machine == "x86_64":
        program += [op(jge, 0x40000000, 0, 1), op(ret, _SECCOMP_RET_KILL_PROCESS)]
    for number in killed:
        program += [op(jeq, number, 0, 1), op(ret, _SECCOMP_RET_KILL_PROCESS)]
    for number in refused:
        program += [op(jeq, number, 0, 1), op(ret, _SECCOMP_RET_ERRNO | _EPERM)]
    program.append(op(ret, _SECCOMP_RET_ALLOW))
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _prctl(option: int, arg2: int, arg3: int = 0) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(option, arg2, arg3, 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"prctl({option}): {os.strerror(number)}")


def _confine() -> None:
    """no_new_privs, then the filter: from here on this process can neither reach another nor start one."""
    program = _seccomp_filter(os.uname().machine)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
