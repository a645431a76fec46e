"""The isolation ladder: which rungs this host gives this user, and what each missing piece would add.

Rungs, strongest first:
- `namespaces`: bubblewrap, a user namespace, per-run PID/mount/IPC/network namespaces, cgroups
  where writable, seccomp (docs/security.md).
- `landlock`: what an unprivileged container or pod allows: Landlock (a filesystem allow-list,
  no TCP, scoped abstract unix sockets and signals: ABI 6 or newer), seccomp with no_new_privs,
  a uid per run where the server may change uids, rlimits and the memory watchdog, a per-run
  reaper.  No namespace, mount, root or cgroup needed.
- `none`: plain child processes, only when asked for by name.

`auto` takes the strongest rung the probes pass.  The probes try the real thing (a user
namespace with a mount in it; a Landlock ruleset) in a throwaway child: a container's seccomp
profile or an AppArmor policy says no only when asked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import os
import shutil
import subprocess
import sys
from typing import ClassVar, Optional

from verl_sf.errors import VerlSfError
from verl_sf.executor.config import IsolationMode
from verl_sf.executor.system_view import SECCOMP_DENIED, SECCOMP_DENIED_SYSV_IPC, SECCOMP_DENIED_WITHOUT_NAMESPACES
from verl_sf.executor.zygote.linux import LANDLOCK_SCOPED_SIGNALS_ABI, landlock_abi

# Runs in a fresh interpreter: a user namespace, then a mount in a mount namespace of its own, as
# the sandbox's launcher does.  Prints the step that failed and its errno.
_NAMESPACE_PROBE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.geteuid(), os.getegid()
def fail(step):
    print(step, ctypes.get_errno()); sys.exit(1)
if libc.unshare(0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000) != 0:
    fail("unshare")
try:
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1\n")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1\n")
except OSError as exc:
    print("uid_map", exc.errno); sys.exit(1)
if libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) != 0:
    fail("mount-private")
if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=1m") != 0:
    fail("mount")
"""


class IsolationUnavailable(VerlSfError, RuntimeError):
    """The host cannot give the isolation asked for; the message says what is missing and the fix."""


@dataclasses.dataclass(frozen=True)
class Missing:
    piece: str  # what the probe found missing
    adds: str  # what having it would give
    fix: str  # how to get it: a flag, a sysctl, a package


@dataclasses.dataclass(frozen=True)
class RungReport:
    rung: str
    missing: tuple[Missing, ...]
    notes: tuple[str, ...] = ()  # what the rung gives less of here, without being refused

    @property
    def available(self) -> bool:
        return not self.missing


def libseccomp_path() -> Optional[str]:
    return ctypes.util.find_library("seccomp")


def can_change_uids() -> bool:
    """CAP_SETUID and CAP_SETGID in this process's effective set (root in a container has them)."""
    try:
        with open("/proc/self/status") as status:
            effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(effective & (1 << 7)) and bool(effective & (1 << 6))


_SECCOMP_FIX = "install libseccomp (apt-get install libseccomp2 / dnf install libseccomp)"


def probe_namespaces() -> RungReport:
    missing = []
    if shutil.which("bwrap") is None:
        missing.append(Missing("bubblewrap (bwrap)", "builds each sandbox's filesystem view and namespaces",
                               "apt-get install bubblewrap (dnf install bubblewrap)"))
    if libseccomp_path() is None:
        missing.append(Missing("libseccomp", "the seccomp filter every run gets", _SECCOMP_FIX))
    probe = subprocess.run([sys.executable, "-I", "-c", _NAMESPACE_PROBE], capture_output=True, text=True)
    if probe.returncode == 0 and os.geteuid() != 0 and shutil.which("bwrap"):
        # Without root, bubblewrap itself makes the namespaces (some hosts allow them to it alone, or not at all).
        probe = subprocess.run(["bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            probe = subprocess.CompletedProcess(probe.args, 1, "bwrap 1", "")
    if probe.returncode != 0:
        step, _, code = (probe.stdout.strip() or "start ?").partition(" ")
        err = errno.errorcode.get(int(code), code) if code.isdigit() else code
        missing.append(Missing(
            f"user and mount namespaces ({step} refused: {err})",
            "per-run PID, mount, IPC and network namespaces: a private /tmp and /mnt, a loopback of each "
            "run's own, a minimal /etc, nothing of the host's tree writable",
            "in Docker: --security-opt seccomp=unconfined --security-opt apparmor=unconfined (or --privileged); "
            "in Kubernetes: securityContext.seccompProfile.type: Unconfined and appArmorProfile Unconfined; "
            "on a host as an ordinary user: sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0, "
            "and on Ubuntu 23.10+ kernel.apparmor_restrict_unprivileged_userns=0"))
    return RungReport(Namespaces.name, tuple(missing))


def probe_landlock() -> RungReport:
    missing = []
    abi = landlock_abi()
    if abi < LANDLOCK_SCOPED_SIGNALS_ABI:
        found = f"ABI {abi}" if abi else "missing, disabled or refused"
        missing.append(Missing(
            f"Landlock ABI {LANDLOCK_SCOPED_SIGNALS_ABI}+ ({found})",
            "a filesystem allow-list per run, no TCP, and signals and abstract unix sockets scoped to the run",
            "a Linux 6.12+ kernel with Landlock enabled (lsm=...,landlock on the kernel command line); in a "
            "container, a seccomp profile that allows landlock_create_ruleset/add_rule/restrict_self"))
    if libseccomp_path() is None:
        missing.append(Missing("libseccomp", "the seccomp filter every run gets", _SECCOMP_FIX))
    notes = []
    if not can_change_uids():
        notes.append("runs keep this user's uid (no CAP_SETUID): Landlock's scoping, not a uid, keeps them "
                     "from signalling or tracing the server and each other; run the server as root in the "
                     "container to give each run a uid of its own")
    return RungReport(Landlock.name, tuple(missing), tuple(notes))


@dataclasses.dataclass(frozen=True)
class Rung:
    """The rung a server runs on, chosen once at start (`choose`): what its sandboxes are built
    with and what it offers.  No rung's name is compared outside this module: ask the rung."""

    name: ClassVar[str]
    isolated: ClassVar[bool] = False  # a bubblewrap sandbox, per-run namespaces and a view of its own
    confined: ClassVar[bool] = True  # the seccomp filter (and Landlock or namespaces) on every run
    landlocked: ClassVar[bool] = False  # a Landlock domain per run in place of namespaces
    forks: ClassVar[bool] = False  # sessions can be forked and snapshotted (with Landlock ABI 6, see executor)
    offers_root: ClassVar[bool] = False  # E2B's user="root": uid 0 of a user namespace of the sandbox's own
    reason: str  # why it was chosen

    def seccomp_denied(self, memory_cgroup: bool) -> list[str]:
        """The system calls the runs' filter refuses (system_view.py).  Without a memory cgroup, SysV IPC
        too: a detached segment is in no process's memory, so the watchdog could not count it."""
        if not self.confined:
            return []
        return [*SECCOMP_DENIED, *(() if memory_cgroup else SECCOMP_DENIED_SYSV_IPC)]

    def run_uids(self, base: int) -> tuple[int, int]:
        """(first, count) of the host uids runs get one of each; count 0: they keep the server's (or
        the sandbox's) own."""
        return 0, 0

    def warning(self) -> Optional[str]:
        """A loud line for the start-up log where the rung is unsafe; None otherwise."""
        return None

    def limits(self, cgroups: bool) -> dict[str, str]:
        """How each cap is enforced on this rung, for /health (the sandbox launcher adds its uid)."""
        return {"memory": "cgroup per run" if cgroups else
                          "RLIMIT_DATA per process and a watchdog that kills a run past its cap (no writable cgroup)",
                "processes": "pids cgroup per run" if cgroups else "RLIMIT_NPROC, shared by runs of one uid",
                "seccomp": "on",
                **({} if cgroups else {"sysv_ipc": "refused: a detached segment is beyond the watchdog"})}


class Namespaces(Rung):
    name = "namespaces"
    isolated = True
    forks = True
    offers_root = True

    def limits(self, cgroups: bool) -> dict[str, str]:
        own = {} if cgroups else {"processes": "RLIMIT_NPROC in a user namespace of each run's own (counted apart)"}
        return {**super().limits(cgroups), **own, "network": "a network namespace per run (its own loopback)"}


class Landlock(Rung):
    name = "landlock"
    landlocked = True

    def seccomp_denied(self, memory_cgroup: bool) -> list[str]:
        # No network namespace: no socket at all (socketpair still works); no IPC namespace: no SysV IPC.
        return [*SECCOMP_DENIED, *SECCOMP_DENIED_SYSV_IPC, *SECCOMP_DENIED_WITHOUT_NAMESPACES, "socket"]

    def run_uids(self, base: int) -> tuple[int, int]:
        return (base + RUN_UIDS_OFFSET, RUN_UIDS) if can_change_uids() else (0, 0)

    def limits(self, cgroups: bool) -> dict[str, str]:
        status = super().limits(cgroups)
        status["landlock"] = (f"ABI {landlock_abi()}: filesystem allow-list, no TCP, scoped signals and abstract "
                              "unix sockets")
        status["network"] = "none: socket() refused (socketpair works)"
        status["sysv_ipc"] = "refused: no IPC namespace (segments would be the host's)"
        status["posix_mqueue"] = "refused: no IPC namespace (queues would be the host's)"
        status["inotify"] = "refused: a watch names files Landlock keeps a run from listing"
        if not can_change_uids() and not cgroups:
            status["processes"] = "counted per run by the zygote's watchdog (the uid is shared)"
        return status


class Unisolated(Rung):
    name = "none"
    confined = False

    def warning(self) -> Optional[str]:
        return ("WARNING: --isolation none: code runs as plain child processes of this server, with its "
                "network, files and user. Use only on a throwaway machine.")

    def limits(self, cgroups: bool) -> dict[str, str]:
        return {"memory": "none (isolation none)", "processes": "RLIMIT_NPROC", "uid": "the server's"}


RUNGS: dict[str, type[Rung]] = {kind.name: kind for kind in (Namespaces, Landlock, Unisolated)}
RUN_UIDS_OFFSET, RUN_UIDS = 10000, 50000  # the landlock rung as root: a uid of its own per run, above the base


def probe_all() -> list[RungReport]:
    return [probe_namespaces(), probe_landlock(), RungReport(Unisolated.name, ())]


def choose(mode: IsolationMode) -> Rung:
    """The rung for `mode`, with why; IsolationUnavailable when a demanded rung (or, for auto, every
    rung but `none`) is missing here.  `none` is never chosen unless asked for."""
    if mode == IsolationMode.none:
        return Unisolated("asked for with --isolation none")
    reports = {report.rung: report for report in (probe_namespaces(), probe_landlock())}
    if mode != IsolationMode.auto:
        report = reports[mode.value]
        if not report.available:
            raise IsolationUnavailable(f"--isolation {mode.value} is not available here: " + _describe(report))
        return RUNGS[mode.value](f"asked for with --isolation {mode.value}")
    passed_over: list[str] = []
    for kind in (Namespaces, Landlock):
        if reports[kind.name].available:
            why = "the strongest rung this host allows"
            if passed_over:
                why += "; " + "; ".join(passed_over)
            return kind(why)
        passed_over.append(f"{kind.name} is not available: {_describe(reports[kind.name])}")
    raise IsolationUnavailable("no isolation rung is available here: " + "; ".join(passed_over) +
                               ". Run `verl-sf doctor` for the fixes, or start with --isolation none "
                               "on a throwaway machine (code then runs unisolated)")


def _describe(report: RungReport) -> str:
    return "; ".join(f"{m.piece} (fix: {m.fix})" for m in report.missing)
