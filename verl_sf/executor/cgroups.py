"""Per-slot cgroups: the memory cap (instead of RLIMIT_AS) and the process cap.

RLIMIT_AS counts reserved address space, so numpy/OpenBLAS thread stacks and arenas break
under it ("pthread_create failed") long before real memory runs out.  A memory cgroup
counts pages actually used, including the run's tmpfs files.  Both cgroup v1 (separate
`memory` and `pids` hierarchies) and v2 (one unified tree) are handled; when neither is
writable the executor runs without them and says so in /health.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


class SlotCgroup:
    """The cgroup(s) one sandbox slot lives in; its zygote and every run it forks are inside."""

    def __init__(self, memory_dir: Path, pids_dir: Path, v2: bool):
        self.memory_dir = memory_dir
        self.pids_dir = pids_dir
        self.v2 = v2
        self._memory_limit: Optional[int] = None
        self._oom_events_fd: Optional[int] = None

    @property
    def procs_files(self) -> list[str]:
        dirs = {self.memory_dir, self.pids_dir}
        return [str(d / "cgroup.procs") for d in dirs]

    def set_memory_limit(self, limit_bytes: Optional[int]) -> None:
        """Cap the slot's memory; None lifts the cap (while a warm interpreter starts)."""
        if limit_bytes == self._memory_limit:
            return
        name = "memory.max" if self.v2 else "memory.limit_in_bytes"
        unlimited = "max" if self.v2 else "-1"
        _write(self.memory_dir / name, unlimited if limit_bytes is None else str(limit_bytes))
        self._memory_limit = limit_bytes

    def set_pids_limit(self, count: int) -> None:
        _write(self.pids_dir / "pids.max", str(count))

    def memory_usage(self) -> int:
        name = "memory.current" if self.v2 else "memory.usage_in_bytes"
        return int((self.memory_dir / name).read_text())

    def oom_kills(self) -> int:
        """Processes of the slot the kernel has killed for memory, so far.  Read before and
        after every job, through a descriptor kept open (the kernel regenerates the file on
        each read from offset 0): opening it twice per job cost ~0.1 ms of the server's CPU."""
        if self._oom_events_fd is None:
            name = "memory.events" if self.v2 else "memory.oom_control"
            self._oom_events_fd = os.open(self.memory_dir / name, os.O_RDONLY | os.O_CLOEXEC)
        for line in os.pread(self._oom_events_fd, 4096, 0).splitlines():
            key, _, value = line.partition(b" ")
            if key == b"oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        if self._oom_events_fd is not None:
            os.close(self._oom_events_fd)
            self._oom_events_fd = None
        for directory in {self.memory_dir, self.pids_dir}:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # the slot's processes are still being reaped


class CgroupManager:
    """Creates one parent group per server and one child group per slot."""

    def __init__(self, name: str):
        self.name = name
        self.v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        self.available = False
        self.reason = ""
        self._parents: list[Path] = []
        try:
            self._setup()
            self.available = True
        except OSError as exc:
            self.reason = f"cgroups not writable ({exc}); memory and process caps fall back to rlimits"
            log.warning("verl-sf: %s", self.reason)

    def _setup(self) -> None:
        bases = [CGROUP_ROOT] if self.v2 else [CGROUP_ROOT / "memory", CGROUP_ROOT / "pids"]
        for base in bases:
            _sweep_stale_groups(base)
        if self.v2:
            parent = CGROUP_ROOT / self.name
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", "+memory +pids")
            self._parents = [parent]
        else:
            mem, pids = CGROUP_ROOT / "memory" / self.name, CGROUP_ROOT / "pids" / self.name
            for parent in (mem, pids):
                parent.mkdir(exist_ok=True)
            self._parents = [mem, pids]

    def slot(self, index: int) -> SlotCgroup:
        if self.v2:
            path = self._parents[0] / f"slot{index}"
            path.mkdir(exist_ok=True)
            return SlotCgroup(path, path, v2=True)
        mem, pids = (parent / f"slot{index}" for parent in self._parents)
        mem.mkdir(exist_ok=True)
        pids.mkdir(exist_ok=True)
        return SlotCgroup(mem, pids, v2=False)

    def remove(self) -> None:
        for parent in self._parents:
            try:
                parent.rmdir()
            except OSError:
                pass


def _sweep_stale_groups(base: Path) -> None:
    """Remove the empty groups of servers that died without cleaning up (SIGKILL, OOM, power
    loss): `verl-sf-<pid>-...` whose pid is gone.  Groups with processes in them stay."""
    for parent in base.glob("verl-sf-*-*"):
        pid = parent.name.split("-")[2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        for group in [*parent.glob("slot*"), parent]:
            try:
                group.rmdir()
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    return True


def join_cgroups(procs_files: list[str]) -> None:
    """Move the calling process into the given groups (runs in the child before exec)."""
    pid = str(os.getpid())
    for path in procs_files:
        _write(Path(path), pid)
