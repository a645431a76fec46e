"""cgroups delegated to each sandbox, in which its zygote makes one group per run and session.

A memory cgroup counts pages actually used (including the run's tmpfs files), unlike
RLIMIT_AS, under which numpy/OpenBLAS thread stacks break long before memory runs out; a pids
cgroup caps one run's processes without sharing the cap with every run of the same uid.
The server creates `verl-sf-<pid>-<id>/<sandbox>` per controller and hands it to the sandbox's
root uid (an unprivileged host uid), as systemd delegates a subtree: the zygote inside may then
create, limit and join groups below it and nothing else.  Both cgroup v1 (separate `memory` and
`pids` hierarchies) and v2 (one unified tree) are handled; when neither is writable the runs
fall back to rlimits and /health says so.

Under v1 the memory hierarchy is `verl-sf-<pid>-<id>/runs/<sandbox>`, the cap on `runs`, and the
zygotes live beside it in `verl-sf-<pid>-<id>/zygotes`: runs that fill the cap make the kernel
reclaim and kill inside it, and a zygote there would wait in that reclaim on its next fork, with
every run it holds.  (v2 moves a process only within a delegated subtree, so there the zygote's
leaf stays inside its sandbox's group.)

Also under v1, where a `cpu` hierarchy is ours to write, the sandboxes live in a group of it,
`verl-sf-<pid>-<id>/<sandbox>`, and each run and session in a group of its own below: the kernel's
autogroups (`sched_autogroup_enabled`) give each session, and so each run (a run calls setsid), as
large a share of the CPU as the server's, whatever its nice, in the root group only.  100 runs
spinning then left the server a hundredth of the machine.  A group per run weighs a run of 150
spinning processes as one: a run past its first slice drops to the lowest weight (`cpu.shares`);
renicing its processes, done too, orders them only against each other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Optional

from verl_sf.executor.zygote.messages import ZYGOTE_LEAF

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
# v1: a run's weight counts against every run's, whichever sandbox has it: their groups are siblings.
SHARED = ("cpu",)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


class SandboxCgroup:
    """The groups one sandbox lives in, one directory per controller (the same one under v2)."""

    def __init__(self, dirs: dict[str, Path], v2: bool, homes: Optional[dict[str, Path]] = None,
                 cpu_counter: str = "", prefix: str = ""):
        self.dirs = {controller: str(path) for controller, path in dirs.items()}
        self.v2 = v2
        self.cpu_counter = cpu_counter  # the controller whose run groups count each run's CPU; "": none
        self.prefix = prefix  # of its run groups' names, which are unique among every sandbox's
        # Where the zygote itself lives, by controller: its delegated directory unless given.
        self.homes = {**self.dirs, **{controller: str(path) for controller, path in (homes or {}).items()}}

    @property
    def procs_files(self) -> list[str]:
        """The groups the zygote joins as it starts."""
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.homes.values())]

    def delegate(self, uid: int) -> None:
        """Hand the directories to `uid`, which may then create and fill groups below them."""
        for directory in dict.fromkeys(self.dirs.values()):
            for name in ("", "cgroup.procs", "cgroup.subtree_control", "tasks"):
                path = os.path.join(directory, name)
                if os.path.exists(path):
                    os.chown(path, uid, uid)

    def prepare(self) -> None:
        """Before the sandbox (re)starts, v2: its group hands nothing down, so that its first process may join it
        (and so be the root of the sandbox's cgroup namespace, with the run groups inside it)."""
        for directory in dict.fromkeys(self.dirs.values()) if self.v2 else ():
            control = Path(directory, "cgroup.subtree_control")
            if control.read_text().strip():
                _write(control, "-memory -pids")

    def settle(self) -> None:
        """Once the sandbox is up, v2: the processes left in its group (bubblewrap's; the zygote moved itself)
        join the zygote's leaf, and the group hands memory and pids down to the run groups."""
        for directory in dict.fromkeys(self.dirs.values()) if self.v2 else ():
            for pid in Path(directory, "cgroup.procs").read_text().split():
                try:
                    _write(Path(directory, ZYGOTE_LEAF, "cgroup.procs"), pid)
                except ProcessLookupError:
                    continue
            _write(Path(directory, "cgroup.subtree_control"), "+memory +pids")
            _hand_over_interfaces(Path(directory))

    def remove(self) -> None:
        """Once its zygote is gone: its groups, and its run groups where every sandbox's are kept."""
        for controller, directory in {d: c for c, d in self.dirs.items()}.items():
            if controller in SHARED:
                for group in Path(directory).glob(f"{self.prefix}run-*"):
                    _remove_tree(group, kill=True)
            else:
                _remove_tree(Path(directory), kill=True)


def _hand_over_interfaces(directory: Path) -> None:
    """Groups the zygote made before its group handed memory and pids down got those controllers'
    files from the kernel, owned by root: they go to the group's owner, who must write its caps."""
    for child in directory.iterdir():
        if not child.is_dir() or child.name == ZYGOTE_LEAF:
            continue
        owner = child.stat()
        for entry in child.iterdir():
            if entry.is_file() and entry.stat().st_uid != owner.st_uid:
                os.chown(entry, owner.st_uid, owner.st_gid)


def _remove_tree(directory: Path, attempts: int = 50, kill: bool = False) -> None:
    """Remove a group and the run groups under it (children first), waiting briefly for the
    kernel to finish tearing down what was killed in them.  `kill`: SIGKILL what is still in them
    (a zygote killed mid-walk can leave a run's processes behind on the landlock rung)."""
    for child in sorted(directory.glob("*/"), reverse=True):
        if child.is_dir():
            _remove_tree(child, attempts, kill)
    for _ in range(attempts):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if kill:
                _kill_members(directory)
            time.sleep(0.05)


def _kill_members(directory: Path) -> None:
    try:
        members = Path(directory, "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in members:
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)


class CgroupManager:
    """Creates one parent group per server and one delegated group per sandbox.

    Under cgroup v2 the parent goes at the top of the tree when that is writable (root), else in
    the subtree delegated to this process (`systemd-run --user --scope -p Delegate=yes`): the
    server first moves itself to a leaf of its own there, as cgroup v2 keeps processes out of
    groups that hand controllers down."""

    def __init__(self, name: str, memory_cap_bytes: int = 0, root: Path = CGROUP_ROOT,
                 own_group: Optional[str] = None):
        self.name = name
        self.memory_cap_bytes = memory_cap_bytes
        self.root = root
        self.own_group = own_group if own_group is not None else _own_v2_group()
        self.v2 = (root / "cgroup.controllers").exists()
        self.available = False
        self.reason = ""
        self._tops: dict[str, Path] = {}  # this server's group, by controller
        self._parents: dict[str, Path] = {}  # where the sandboxes' groups go, by controller
        self._homes: dict[str, Path] = {}  # where the zygotes live when not in their sandbox's group
        self._usage_fd: Optional[int] = None  # the runs' memory.current (v2) or memory.usage_in_bytes (v1)
        self.cpu_counter = ""  # the controller whose run groups count each run's CPU whole; "": none does
        try:
            self._setup()
            self.cpu_counter = self._cpu_counter()
            self.available = True
        except OSError as exc:
            self.reason = f"cgroups not writable ({exc}); memory and process caps fall back to rlimits"
            log.warning("verl-sf: %s", self.reason)

    def _setup(self) -> None:
        if self.v2:
            top = self._v2_base()
            bases = {c: top for c in CONTROLLERS}
        else:
            bases = {c: self.root / c for c in CONTROLLERS}
        for base in dict.fromkeys(bases.values()):
            _sweep_stale_groups(base)
        for controller, base in bases.items():
            top = base / self.name
            top.mkdir(exist_ok=True)
            self._tops[controller] = self._parents[controller] = top
        if self.v2:
            _write(self._parents["memory"] / "cgroup.subtree_control", "+memory +pids")
        else:
            self._parents["memory"] = self._tops["memory"] / "runs"
            self._homes["memory"] = self._tops["memory"] / "zygotes"
            for group in (self._parents["memory"], self._homes["memory"]):
                group.mkdir(exist_ok=True)
            self._cpu_groups()
        if self.memory_cap_bytes:  # an out-of-memory kill then stays among the runs
            _write(self._parents["memory"] / ("memory.max" if self.v2 else "memory.limit_in_bytes"),
                   str(self.memory_cap_bytes))

    def _cpu_groups(self) -> None:
        """v1: a group of the cpu controller, delegated to every sandbox, where the zygotes live and
        make a group per run, all of them siblings, where one is mounted and ours to write; without
        one they keep the root group.  Of cpuacct where it is mounted apart (where it shares cpu's
        hierarchy, the cpu groups count), a group for the sandboxes with each one's delegated below
        it: the CPU a run's processes used, the ones gone included."""
        for controller, probe in (("cpu", "cpu.shares"), ("cpuacct", "cpuacct.usage")):
            base = self.root / controller
            if not (base / probe).exists() or (controller == "cpuacct" and "cpu" in self._tops
                                               and base.resolve() == (self.root / "cpu").resolve()):
                continue
            try:
                _sweep_stale_groups(base)
                (base / self.name).mkdir(exist_ok=True)
            except OSError as exc:
                log.warning("verl-sf: no %s cgroup for the sandboxes (%s): %s", controller, exc,
                            "each run competes for the CPU as its own autogroup, with the server" if controller == "cpu"
                            else "a run's CPU is what its live processes and the children they waited for used")
                continue
            self._tops[controller] = self._parents[controller] = base / self.name

    def _v2_base(self) -> Path:
        """The top of the tree if we may write there, else our own delegated group."""
        if os.access(self.root / "cgroup.subtree_control", os.W_OK) or not self.own_group:
            return self.root
        own = self.root / self.own_group.lstrip("/")
        if not os.access(own / "cgroup.subtree_control", os.W_OK):
            raise PermissionError(f"neither {self.root} nor this process's own group {own} is delegated to it")
        leaf = own / "verl-sf-server"
        leaf.mkdir(exist_ok=True)
        for pid in (own / "cgroup.procs").read_text().split():  # no process may stay in a group that delegates
            _write(leaf / "cgroup.procs", pid)
        _write(own / "cgroup.subtree_control", "+memory +pids")
        return own

    @property
    def cpu_per_run(self) -> bool:
        """Whether each run and session weighs alike for the CPU, in a cpu group of its own."""
        return "cpu" in self._parents

    def _cpu_counter(self) -> str:
        """The controller whose run groups count each run's CPU whole (v1's cpuacct.usage, v2's cpu.stat,
        keyed as the zygote's `CPU_COUNTERS`): the zygote then demotes a run for the CPU it used, where
        otherwise ("": none counts) for the time it lived."""
        if self.v2:
            return "memory"  # v2: one group for every controller, and every group has cpu.stat
        if "cpuacct" in self._parents:
            return "cpuacct"
        return "cpu" if "cpu" in self._parents and (self._parents["cpu"] / "cpuacct.usage").exists() else ""

    def sandbox(self, name: str) -> Optional[SandboxCgroup]:
        if not self.available:
            return None
        dirs = {}
        for controller, parent in self._parents.items():
            dirs[controller] = parent if controller in SHARED else parent / name
            dirs[controller].mkdir(exist_ok=True)
        return SandboxCgroup(dirs, self.v2, self._homes, self.cpu_counter, f"{name}.")

    def memory_usage(self) -> Optional[int]:
        """Bytes charged to all runs and sessions together (files in their tmpfs included).  Read on
        every session call: the file stays open and each read is one pread (the kernel renders it anew)."""
        if "memory" not in self._parents:
            return None
        try:
            if self._usage_fd is None:
                name = "memory.current" if self.v2 else "memory.usage_in_bytes"
                self._usage_fd = os.open(self._parents["memory"] / name, os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(self._usage_fd, 32, 0))
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        if self._usage_fd is not None:
            os.close(self._usage_fd)
            self._usage_fd = None
        for top in dict.fromkeys(self._tops.values()):
            _remove_tree(top)


def _sweep_stale_groups(base: Path) -> None:
    """Remove the empty groups of servers that died without cleaning up (SIGKILL, OOM, power
    loss): `verl-sf-<pid>-...` whose pid is gone.  Groups with processes in them stay."""
    for parent in base.glob("verl-sf-*-*"):
        pid = parent.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            _remove_tree(parent, attempts=1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    return True


def _own_v2_group() -> str:
    """This process's group in the unified hierarchy (/proc/self/cgroup's `0::` line), "" if none."""
    try:
        with open("/proc/self/cgroup") as fh:
            return next((line.strip()[3:] for line in fh if line.startswith("0::")), "")
    except OSError:
        return ""


def join_cgroups(procs_files: list[str]) -> None:
    """Move the calling process into the given groups (runs in the child before exec)."""
    pid = str(os.getpid())
    for path in procs_files:
        _write(Path(path), pid)
