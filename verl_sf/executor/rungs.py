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
from typing import Optional

from verl_sf.errors import VerlSfError
from verl_sf.executor.config import IsolationMode
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
    return RungReport("namespaces", tuple(missing))


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
    return RungReport("landlock", tuple(missing), tuple(notes))


def probe_all() -> list[RungReport]:
    return [probe_namespaces(), probe_landlock(), RungReport("none", ())]


def choose(mode: IsolationMode) -> tuple[str, str]:
    """(rung, why) for `mode`; IsolationUnavailable when a demanded rung (or, for auto, every rung
    but `none`) is missing here.  `none` is never chosen unless asked for."""
    if mode == IsolationMode.none:
        return "none", "asked for with --isolation none"
    reports = {report.rung: report for report in (probe_namespaces(), probe_landlock())}
    if mode != IsolationMode.auto:
        report = reports[mode.value]
        if not report.available:
            raise IsolationUnavailable(f"--isolation {mode.value} is not available here: " + _describe(report))
        return mode.value, f"asked for with --isolation {mode.value}"
    passed_over: list[str] = []
    for rung in ("namespaces", "landlock"):
        if reports[rung].available:
            why = "the strongest rung this host allows"
            if passed_over:
                why += "; " + "; ".join(passed_over)
            return rung, why
        passed_over.append(f"{rung} is not available: {_describe(reports[rung])}")
    raise IsolationUnavailable("no isolation rung is available here: " + "; ".join(passed_over) +
                               ". Run `verl-sf doctor` for the fixes, or start with --isolation none "
                               "on a throwaway machine (code then runs unisolated)")


def _describe(report: RungReport) -> str:
    return "; ".join(f"{m.piece} (fix: {m.fix})" for m in report.missing)
