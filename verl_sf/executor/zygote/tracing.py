"""System calls made on another process's behalf (ptrace), for forking a session's interpreter.

A fork must be made by the process that holds the state, but that process runs model code with
no capabilities: whatever it may do, the code may do.  So the zygote stops it between calls and
makes the calls itself, with values that never enter the process's memory.  x86-64 only: the
registers below are that architecture's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from typing import Optional

from .linux import libc

PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH, PTRACE_SYSCALL = 7, 12, 13, 17, 24
PTRACE_SETOPTIONS, PTRACE_GETEVENTMSG, PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4200, 0x4201, 0x4206, 0x4207
PTRACE_GETSIGMASK, PTRACE_SETSIGMASK = 0x420A, 0x420B
ALL_SIGNALS = 2**64 - 1  # the kernel leaves SIGKILL and SIGSTOP out
PTRACE_O_TRACESYSGOOD, PTRACE_O_TRACEFORK, PTRACE_O_TRACESECCOMP, PTRACE_O_EXITKILL = 0x1, 0x2, 0x80, 0x100000
PTRACE_EVENT_FORK, PTRACE_EVENT_STOP = 1, 128
WALL = 0x40000000  # __WALL
SYSCALL_INSTRUCTION = b"\x0f\x05"
RESTART_ERRORS = (-512, -513, -514)  # ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND: the call is made again
IDLE_TRIES, IDLE_WAIT = 200, 0.005  # up to a second for an idle session to reach its read
SCRATCH_BELOW_STACK = 4096  # bytes below the stack pointer our arguments go in (past the red zone)
SYS = {"read": 0, "close": 3, "lseek": 8, "fcntl": 72, "chdir": 80, "open": 2, "dup2": 33, "prctl": 157, "capset": 126,
       "clone": 56, "setsid": 112, "execve": 59, "close_range": 436, "landlock_create_ruleset": 444,
       "landlock_restrict_self": 446}

libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


class TraceError(OSError):
    """The traced process did not behave as a process stopped in a system call does (it died, or ran)."""


class NotIdle(TraceError):
    """The process is not waiting for its next call (its code is doing something else): let go as it was."""


class Registers(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
        "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")]


def supported() -> bool:
    return os.uname().machine == "x86_64"


def _ptrace(request: int, pid: int, addr: int = 0, data: int = 0) -> int:
    result: int = libc.ptrace(request, pid, addr, data)
    if result == -1:
        err = ctypes.get_errno()
        raise TraceError(err, f"ptrace({request:#x}, {pid}): {os.strerror(err)}")
    return result


def _wait(pid: int) -> int:
    """The next stop of `pid`; TraceError if it is gone instead."""
    _, status = os.waitpid(pid, WALL)
    if not os.WIFSTOPPED(status):
        raise TraceError(f"process {pid} ended while traced")
    return status


class Tracee:
    """A process stopped by us: its registers as found, and calls made in its name."""

    def __init__(self, pid: int, attach: bool = True, reading: tuple[int, ...] = ()):
        """Stop `pid` (or take a fork of a tracee's, stopped already).  With `reading`, stop it
        only once it waits for input on one of those descriptors (an idle session may still be
        finishing its last call's loop): a tracee stopped elsewhere is let go and tried again."""
        self.pid = pid
        self.mem = -1
        if attach:
            # TRACESECCOMP: the filter hands clone with namespace flags to us (seccomp.py), and we let ours go on.
            _ptrace(PTRACE_SEIZE, pid, 0,
                    PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACEFORK | PTRACE_O_TRACESECCOMP | PTRACE_O_EXITKILL)
            _ptrace(PTRACE_INTERRUPT, pid)
        self.status = _wait(pid)
        self.saved = self.registers()
        self.mem = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        for _ in range(IDLE_TRIES if reading else 0):
            if self._reading(reading):
                break
            _ptrace(PTRACE_CONT, pid)
            time.sleep(IDLE_WAIT)
            _ptrace(PTRACE_INTERRUPT, pid)
            self.status = _wait(pid)
            self.saved = self.registers()
        else:
            if reading:
                self.detach()
                raise NotIdle(f"process {pid} did not come to wait for its next call")
        # Interrupted in a call, it stands past the instruction; stopped before making one (a
        # snapshot, or a copy just made), on it or past it.
        self.gate = self.saved.rip if self._on_gate() else self.saved.rip - 2
        if os.pread(self.mem, 2, self.gate) != SYSCALL_INSTRUCTION:
            self.detach()
            raise NotIdle(f"process {pid} is not waiting in a system call")
        self.scratch = (self.saved.rsp - SCRATCH_BELOW_STACK) & ~0xF
        # The process's own signals (a fast timer) would interrupt the calls we make in its name
        # (clone fails with ERESTARTNOINTR): held back until we let go.
        self.mask = self.signal_mask()
        self.set_signal_mask(ALL_SIGNALS)

    def _on_gate(self) -> bool:
        """Stopped on a system call instruction, about to make it (not in the middle of one)."""
        return (os.pread(self.mem, 2, self.saved.rip) == SYSCALL_INSTRUCTION
                and self.saved.rax - 2**64 not in RESTART_ERRORS)

    def _reading(self, fds: tuple[int, ...]) -> bool:
        """Blocked in read(2) on one of `fds`, or stopped about to make that call."""
        regs = self.saved
        if regs.rdi not in fds:
            return False
        if regs.orig_rax == SYS["read"] and regs.rax - 2**64 in RESTART_ERRORS:
            return True
        return regs.rax == SYS["read"] and self._on_gate()

    def registers(self) -> Registers:
        regs = Registers()
        _ptrace(PTRACE_GETREGS, self.pid, 0, ctypes.addressof(regs))
        return regs

    def set_registers(self, regs: Registers) -> None:
        _ptrace(PTRACE_SETREGS, self.pid, 0, ctypes.addressof(regs))

    def signal_mask(self) -> int:
        mask = ctypes.c_uint64()
        _ptrace(PTRACE_GETSIGMASK, self.pid, ctypes.sizeof(mask), ctypes.addressof(mask))
        return mask.value

    def set_signal_mask(self, mask: int) -> None:
        value = ctypes.c_uint64(mask)
        _ptrace(PTRACE_SETSIGMASK, self.pid, ctypes.sizeof(value), ctypes.addressof(value))

    def put(self, data: bytes, offset: int = 0) -> int:
        """Copy `data` into the scratch area below the stack; its address there."""
        address = self.scratch - 2048 + offset
        os.pwrite(self.mem, data, address)
        return address

    def call(self, name: str, *args: int) -> int:
        """Make one system call as this process; its raw result (negative: -errno).  A fork made
        by the call is left stopped: `forked` holds its pid."""
        regs = Registers.from_buffer_copy(self.saved)
        regs.rip, regs.rax, regs.orig_rax = self.gate, SYS[name], 2**64 - 1
        for field, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args, strict=False):
            setattr(regs, field, value % 2**64)
        self.set_registers(regs)
        self.forked: Optional[int] = None
        entered = False
        while True:
            _ptrace(PTRACE_SYSCALL, self.pid)
            status = _wait(self.pid)
            event = status >> 16
            if event == PTRACE_EVENT_FORK:
                message = ctypes.c_ulong()
                _ptrace(PTRACE_GETEVENTMSG, self.pid, 0, ctypes.addressof(message))
                self.forked = message.value
                continue
            if os.WSTOPSIG(status) != (signal.SIGTRAP | 0x80):
                continue  # the filter's seccomp stop (let go on), or a signal, delivered once we let go
            if entered:
                break
            entered = True
        result = self.registers().rax
        return result - 2**64 if result >= 2**63 else result

    def check(self, name: str, *args: int) -> int:
        result = self.call(name, *args)
        if result < 0:
            raise TraceError(-result, f"{name} in process {self.pid}: {os.strerror(-result)}")
        return result

    def resume_as(self, regs: Registers, mask: int, stop: bool = False) -> None:
        """Let go, carrying on from `regs` (a call we interrupted is made again) with signal `mask`;
        `stop` leaves it stopped (SIGSTOP) instead of running."""
        self.set_signal_mask(mask)
        regs = Registers.from_buffer_copy(regs)
        if regs.rax - 2**64 in RESTART_ERRORS and regs.orig_rax < 2**63:
            regs.rip -= 2
            regs.rax = regs.orig_rax
        self.set_registers(regs)
        self.close()
        if stop:
            os.kill(self.pid, signal.SIGSTOP)  # delivered once we let go: it never runs a step of its own
        _ptrace(PTRACE_DETACH, self.pid)

    def detach(self) -> None:
        """Let go as it stands (after an exec, say)."""
        self.close()
        _ptrace(PTRACE_DETACH, self.pid)

    def close(self) -> None:
        if self.mem >= 0:
            os.close(self.mem)
            self.mem = -1

    def kill(self) -> None:
        self.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
