"""A run's end, seen as it begins: its PID 1's `exit_group`, held by a seccomp notification.

A cells run's PID 1, and a fast-path python run's, is the forked interpreter that ran the code,
so its exit status is the verdict, and the kernel reports it (wait4, a pidfd) only once the process
has torn down its copy-on-write address space (the pages its code wrote) and its namespaces.
Instead the child adds a filter that hands the `exit_group` calls of its threads and of every
process it starts to a listener, and sends the listener to the zygote before the code runs.  The
first call of a thread of PID 1 is the verdict: its argument is the status the kernel would report
(the first call of a thread group sets it), and the caller, blocked in the call, runs no more code;
other processes' calls are let go.  The zygote then kills every process of the run and answers;
the teardown happens after.  A run whose PID 1 dies otherwise (a signal, the last thread's `exit`)
is answered once the kernel reports it, as before.

Cells runs always; a python run only while the server has fewer runs in flight than CPUs
(`hold_exit`, set by admission.py): the filter and the descriptor's passing cost more CPU than the
teardown they take off the reply's path, which only a busy machine misses (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
from typing import Optional

from .linux import libc
from .wire import READ_CHUNK

# Per architecture: seccomp(2)'s number, exit_group's, and the audit architecture a filter checks.
SYSCALLS = {"x86_64": (317, 231, 0xC000003E), "aarch64": (277, 94, 0xC00000B7)}
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 1, 1 << 3
SECCOMP_RET_USER_NOTIF, SECCOMP_RET_ALLOW = 0x7FC00000, 0x7FFF0000
SECCOMP_IOCTL_NOTIF_RECV, SECCOMP_IOCTL_NOTIF_SEND = 0xC0502100, 0xC0182101  # _IOWR('!', 0|1, ...)
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
NOTIFICATION = struct.Struct("=QIIiIQ6Q")  # struct seccomp_notif: id, pid, flags, then seccomp_data
RESPONSE = struct.Struct("=QqiI")  # struct seccomp_notif_resp: id, val, error, flags
BPF_LD_ABS_W, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _program() -> Optional[bytes]:
    known = SYSCALLS.get(os.uname().machine)
    if known is None:
        return None
    _, exit_group, arch = known
    instructions = [
        (BPF_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ_K, 0, 3, arch),
        (BPF_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
        (BPF_JEQ_K, 0, 1, exit_group),
        (BPF_RET_K, 0, 0, SECCOMP_RET_USER_NOTIF),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)


PROGRAM = _program()
# Built in the zygote: in a forked child, making these ctypes objects costs ~0.3 ms of page copies.
_BUFFER = ctypes.create_string_buffer(PROGRAM or b"", len(PROGRAM or b""))
_FPROG = ctypes.pointer(_SockFprog(len(_BUFFER) // 8, ctypes.cast(_BUFFER, ctypes.c_char_p)))
_SECCOMP = SYSCALLS.get(os.uname().machine, (-1,))[0]


def hand_over(channel: int) -> None:
    """In the child, after its other filter and before the run's code: the exit filter, its listener
    sent to the zygote on `channel` (the job socket) and closed here.  Without seccomp's listeners
    (an old kernel, a filter above us refusing the call) the run simply ends as before."""
    if PROGRAM is None:
        return
    listener = libc.syscall(_SECCOMP, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, _FPROG)
    if listener < 0:
        return
    sender = socket.socket(fileno=channel)
    try:
        socket.send_fds(sender, [b"L"], [listener])
    except OSError:
        pass  # no zygote to take it: nobody answers the notification, and the call fails over to exit
    finally:
        sender.detach()
        os.close(listener)


def receive(channel: int) -> tuple[int, bytes]:
    """In the zygote: the listener a run's child sent on its job socket (-1 if it closed it without),
    and what came with it (a child that failed to set up says so instead: wire.setup_failure)."""
    receiver = socket.socket(fileno=channel)
    try:
        data, fds, _, _ = socket.recv_fds(receiver, READ_CHUNK, 1)
    except OSError:
        return -1, b""
    finally:
        receiver.detach()
    for fd in fds:
        os.set_inheritable(fd, False)  # recv_fds drops MSG_CMSG_CLOEXEC
    return (fds[0] if fds else -1), data


def take(listener: int) -> Optional[tuple[int, int, int]]:
    """The next notification: (its id, the calling thread as this zygote sees it, the status asked
    for); None if the caller died meanwhile."""
    buffer = bytearray(NOTIFICATION.size)
    try:
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, buffer, True)
    except OSError:
        return None
    notice_id, pid, _, _, _, _, status, *_ = NOTIFICATION.unpack(buffer)
    return notice_id, pid, status & 0xFF


def let_go(listener: int, notice_id: int) -> None:
    """Let the held call go on (a process other than PID 1 exiting)."""
    with contextlib.suppress(OSError):  # ENOENT: it was killed meanwhile
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND,
                    bytearray(RESPONSE.pack(notice_id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE)), True)
