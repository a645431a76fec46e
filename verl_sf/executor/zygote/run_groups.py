"""One cgroup per job (memory and pids caps; its CPU weight and use under cgroup v1), below the sandbox's
delegated directories, which the zygote reaches through descriptors only (v1's cpu one holds every
sandbox's jobs, each named with its sandbox's prefix: siblings, so a job's weight counts against every
job's).  Emptied groups are reused rather than made and removed per run; the limits last written to
each are remembered so a reused group is written only when a value changes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Optional

from . import procfs
from .messages import ZYGOTE_LEAF, Limits, MemoryScope, ZygoteConfig

Group = tuple[int, str]  # (descriptor of the delegated directory, the group's name below it)
Groups = dict[str, Group]  # controller -> group
# A job's cpu.shares: in its first slice (the kernel's default); past it (the least); being killed
# (the most: its processes, SIGKILL pending, take a CPU first to end rather than wait behind every job).
FRESH, DEMOTED, KILLED = "1024", "2", "262144"
# cgroup v1's cap on a group's TCP buffers, apart from its memory (400 loopback connections otherwise
# held 2.2 GB against a 128 MB cap, and with it the machine's whole tcp_mem).
TCP_LIMIT = "memory.kmem.tcp.limit_in_bytes"
# Where a group counts its processes' CPU, by controller: (file, key, seconds per unit).  v1: cpuacct's
# own hierarchy, or cpu's where the two share one; v2: every group's cpu.stat.
CPU_COUNTERS = {"cpuacct": ("cpuacct.usage", "", 1e-9), "cpu": ("cpuacct.usage", "", 1e-9),
                "memory": ("cpu.stat", "usage_usec", 1e-6)}


class RunGroups:
    def __init__(self, config: ZygoteConfig):
        self.bases = config["cgroups"]
        self.v2 = config["cgroup_v2"]
        self.prefix = config["group_prefix"]
        self.free: list[Groups] = []
        self.written: dict[tuple[Group, str], str] = {}  # (group, file) -> the value it holds
        self.shares: dict[Group, int] = {}  # a group's cpu.shares, kept open: a session's calls write it twice each
        # Which group counts a job's CPU whole, its processes gone included (children reaped by the
        # kernel for a parent ignoring SIGCHLD add nothing to it in /proc), as the server found it.
        counter = config["cpu_counter"]
        self.counter = (counter, *CPU_COUNTERS[counter]) if counter in self.bases else None
        self.used_before: dict[Group, int] = {}  # a reused group's counter when it was released
        # v1 charges TCP buffers only to a group with a TCP cap (v2 with the rest); the file is deprecated,
        # and a kernel without it must still run jobs.
        memory = self.bases.get("memory")
        self.tcp_cap = not self.v2 and memory is not None and os.access(TCP_LIMIT, os.F_OK, dir_fd=memory)
        if self.v2:
            for base in set(self.bases.values()):  # before any fork: every child then starts in the leaf too
                with contextlib.suppress(FileExistsError):
                    os.mkdir(ZYGOTE_LEAF, 0o755, dir_fd=base)
                write((base, ZYGOTE_LEAF), "cgroup.procs", "0")

    def make(self, sequence: int) -> Groups:
        """A group per controller for the next child (the same one for both under v2)."""
        if not self.bases:
            return {}
        if self.free:
            return self.free.pop()
        groups: Groups = {}
        name = f"{self.prefix}run-{sequence}"
        for controller, base in self.bases.items():
            if (base, name) not in groups.values():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=base)
            groups[controller] = (base, name)
        return groups

    def release(self, groups: Groups, killed_for_memory: bool) -> None:
        """Its processes are gone: back to the pool, or removed if a kill is on its counters."""
        if not groups:
            return
        if killed_for_memory:
            for base, name in set(groups.values()):
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=base)
                for controller in ("memory.max", "memory.limit_in_bytes", TCP_LIMIT, "pids.max", "cpu.shares"):
                    self.written.pop(((base, name), controller), None)
                shares = self.shares.pop((base, name), -1)
                if shares >= 0:
                    os.close(shares)
                self.used_before.pop((base, name), None)
            return
        if self.counter is not None and self.counter[0] in groups:
            controller, name, key, _ = self.counter
            self.used_before[groups[controller]] = read_counters(groups[controller], name).get(key, 0)
        if "memory" in groups and not self.v2:
            write(groups["memory"], "memory.failcnt", "0")  # a later kill then says whose cap it was
        self.weigh(groups, FRESH)  # the next child sets up in it ahead of its job
        self.free.append(groups)

    def set_limits(self, groups: Groups, limits: Limits, memory: bool = True) -> None:
        """Raises OSError when a cap cannot be written: a job never runs without the cap it asked for."""
        if memory and limits["memory"] and "memory" in groups:
            self._write_limit(groups["memory"], "memory.max" if self.v2 else "memory.limit_in_bytes",
                              str(limits["memory"]))
            if self.tcp_cap:
                self._write_limit(groups["memory"], TCP_LIMIT, str(limits["memory"]))
        if "pids" in groups:
            self._write_limit(groups["pids"], "pids.max", str(limits["nproc"] + 8))
        self.weigh(groups, FRESH)  # a reused group, or a session's next call, starts in its first slice

    def weigh(self, groups: Groups, shares: str) -> None:
        """A job's CPU weight against every other job, however many processes it has (FRESH, DEMOTED, KILLED)."""
        if "cpu" in groups:
            with contextlib.suppress(OSError):
                self._write_limit(groups["cpu"], "cpu.shares", shares, self._write_shares)

    def _write_limit(self, group: Group, name: str, value: str,
                     writer: Optional[Callable[[Group, str, str], None]] = None) -> None:
        if self.written.get((group, name)) != value:
            self.written.pop((group, name), None)
            (writer or write)(group, name, value)
            self.written[(group, name)] = value

    def _write_shares(self, group: Group, name: str, value: str) -> None:
        """Through a descriptor kept open (closed when the group is removed)."""
        fd = self.shares.get(group)
        if fd is None:
            fd = self.shares[group] = os.open(f"{group[1]}/{name}", os.O_WRONLY | os.O_CLOEXEC, dir_fd=group[0])
        os.write(fd, value.encode())

    def cpu_used(self, groups: Groups) -> Optional[float]:
        """CPU seconds the job's processes used since its group was taken, every one of them counted
        (a reused group's ready child setting up included); None where no group counts it."""
        if self.counter is None or self.counter[0] not in groups:
            return None
        controller, name, key, unit = self.counter
        group = groups[controller]
        used = read_counters(group, name).get(key)
        return None if used is None else (used - self.used_before.get(group, 0)) * unit

    def members(self, groups: Groups) -> Optional[list[int]]:
        """The job's processes, as its group lists them (one read, however many threads they have,
        where walking their tree reads each thread's children); None without a group."""
        for group in groups.values():
            text = read_text(group, "cgroup.procs")
            if text is not None:
                return [int(pid) for pid in text.split()]
        return None

    def memory_kill(self, groups: Groups) -> Optional[MemoryScope]:
        """Whose cap the kernel killed a process of this group for: "own" (the group reached its
        limit), "shared" (the cap over all runs and sessions was reached first), or None."""
        if "memory" not in groups:
            return None
        group = groups["memory"]
        counters = read_counters(group, "memory.events" if self.v2 else "memory.oom_control")
        if counters.get("oom_kill", 0) == 0:
            return None
        # v2 counts the times the group hit its own max; v1, its failcnt (reset when a group is reused).
        hits = counters.get("max", 0) if self.v2 else read_counters(group, "memory.failcnt").get("", 0)
        return "own" if hits > 0 else "shared"

    def path_of(self, groups: Groups) -> Optional[str]:
        """A group's name below the sandbox's memory directory, for the server to read its usage."""
        return groups["memory"][1] if "memory" in groups else None


def write(group: Group, name: str, text: str) -> None:
    """Write a file of a job's cgroup, through the delegated directory's descriptor."""
    base, directory = group
    # as open(..., "w") opens it, without a file object (two writes a session call)
    fd = os.open(f"{directory}/{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666, dir_fd=base)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_text(group: Group, name: str) -> Optional[str]:
    """A file of a job's cgroup, through the delegated directory's descriptor; None if unreadable."""
    base, directory = group
    try:
        return procfs.read(f"{directory}/{name}", dir_fd=base).decode()
    except OSError:
        return None


def read_counters(group: Group, name: str) -> dict[str, int]:
    """`key value` lines of a cgroup file (a file of one number: under the key ""); {} if unreadable."""
    text = read_text(group, name)
    if text is None:
        return {}
    counters = {}
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            counters[key] = int(value)
    return counters
