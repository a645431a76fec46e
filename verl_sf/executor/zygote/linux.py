"""The Linux calls the standard library lacks (through libc), their constants, and small wrappers.

sandbox.py uses the same constants on the server's side.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import signal
import socket
import struct
from collections.abc import Callable
from typing import Optional

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                   CLONE_NEWNET, CLONE_NEWTIME)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_PRIVATE, MS_RELATIME = 1024, 2048, 1 << 18, 1 << 21
PR_SET_DUMPABLE, PR_SET_NAME, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 4, 15, 24, 38, 22
PR_GET_DUMPABLE = 3
PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 36, 1
CLONE_PARENT, CLONE_CHILD_SETTID = 0x8000, 0x01000000
# clone(2), not clone3 (a container's default profile answers ENOSYS to it): its number, and whether
# the child's tid pointer comes after tls, as everywhere but x86_64.
CLONE_CALL = {"x86_64": (56, False), "aarch64": (220, True)}.get(os.uname().machine, (56, False))
SECCOMP_MODE_FILTER = 2
CAPABILITY_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit halves per set
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08
SYS_OPENAT2, SYS_MOUNT_SETATTR = 437, 442  # one number on every architecture (added after 5.1)
SYS_LANDLOCK_CREATE_RULESET, LANDLOCK_CREATE_RULESET_VERSION = 444, 1
LANDLOCK_SCOPED_SIGNALS_ABI = 6  # signals and abstract unix sockets scoped to a domain
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
# _IOWR(0xFF, 11, struct pidfd_info) of its first version (64 bytes); exit_code at byte 60 holds the wait
# status once the process is reaped, where the kernel says so (PIDFD_INFO_EXIT, Linux 6.15).
PIDFD_GET_INFO, PIDFD_INFO_EXIT, PIDFD_INFO_BYTES, PIDFD_EXIT_CODE_AT = 0xC040FF0B, 0x8, 64, 60
PIDFD_EXIT_KERNEL = (6, 15)

libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.syscall.restype = ctypes.c_long
libc.getrandom.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
libc.getrandom.restype = ctypes.c_ssize_t
# Looked up (dlsym) once here rather than in every run, whose lookups would copy pages.
for _name in ("capget", "capset", "mount", "prctl", "setns", "unshare", "syscall"):
    getattr(libc, _name)


# Holds the GIL across the call, as os.fork does: the child starts from where the parent called.
python_libc = ctypes.PyDLL(None, use_errno=True)
python_libc.syscall.restype = ctypes.c_long
libc.pthread_self.restype = ctypes.c_void_p
# Where glibc keeps a thread's tid in its descriptor, as it tells debuggers (libthread_db).
THREAD_TID_OFFSET = (ctypes.c_uint32 * 3).in_dll(libc, "_thread_db_pthread_tid")[2]



class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def check(result: int, what: str) -> None:
    """Raise OSError with errno's text for a libc call that failed."""
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: Optional[bytes], target: bytes, fstype: Optional[bytes], flags: int,
          options: Optional[bytes]) -> None:
    check(libc.mount(source, target, fstype, flags, options), f"mount {target.decode(errors='replace')}")


def bind_home_alias(alias: str, workdir: str) -> None:
    """`alias` (E2B's /home/user) becomes the job's working directory under a second name: a bind,
    not a symlink, so os.getcwd() and `pwd` say it.  In a fork's copied namespace it goes on top
    of the parent's (locked there, as the tmpfs below it), hiding it."""
    if alias:
        mount(workdir.encode(), alias.encode(), None, MS_BIND | MS_REC, None)


def set_capabilities(keep_effective: bool) -> None:
    """Empty the inheritable set (and, unless `keep_effective`, every set)."""
    def edit(half: CapData) -> None:
        half.inheritable = 0
        if not keep_effective:
            half.effective = half.permitted = 0
    _edit_capabilities(edit)


def raise_permitted() -> None:
    """The permitted set (kept across a uid change with PR_SET_KEEPCAPS) made effective again."""
    def edit(half: CapData) -> None:
        half.effective = half.permitted
    _edit_capabilities(edit)


def _edit_capabilities(edit: Callable[[CapData], None]) -> None:
    header = CapHeader(CAPABILITY_VERSION_3, 0)
    data = (CapData * 2)()
    check(libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        edit(half)
    check(libc.capset(ctypes.byref(header), data), "capset")


def shrink_capabilities() -> None:
    """Empty the bounding set for good, keeping the effective capabilities the zygote needs
    (namespaces, mounts, uid changes): an exec in a run can never regain one."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    set_capabilities(keep_effective=True)


def kill(pid: int, isolated: bool) -> None:
    """SIGKILL a job: PID 1 of its namespace (the kernel kills the rest), or its process group."""
    try:
        if isolated:
            os.kill(pid, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def read_only_tree() -> None:
    """Every mount of this mount namespace read-only but /proc (whose files the zygote writes for
    a fork: uid_map): one mount_setattr, or a remount per mount point where the kernel predates it
    (device nodes such as /dev/null stay writable).  Done once by the zygote: each run's mount
    namespace is a copy of its, so every run finds the tree read-only and mounts its own /proc."""
    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
        writable = MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
        check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/proc", 0, ctypes.byref(writable), ctypes.sizeof(writable)),
              "mount_setattr(/proc)")
        return
    if ctypes.get_errno() != errno.ENOSYS:
        check(-1, "mount_setattr(/, MOUNT_ATTR_RDONLY)")
    # The per-mount flags a remount must repeat (they may be locked by an outer namespace).
    kept = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
            "relatime": MS_RELATIME, "nodiratime": MS_NODIRATIME}
    with open("/proc/self/mountinfo") as info:
        mounts = [line.split() for line in info]
    for fields in mounts:
        if fields[4] == "/proc":
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in fields[5].split(","):
            flags |= kept.get(option, 0)
        mount(None, fields[4].replace("\\040", " ").encode(), None, flags, None)


def new_network() -> None:
    """Set up the network namespace this process just made (its /proc mounted): the loopback up
    (SIOCSIFFLAGS), and no TIME_WAIT sockets, so that when it is reused for a later run no port is
    still held by an earlier one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))
    with open("/proc/sys/net/ipv4/tcp_max_tw_buckets", "w") as buckets:
        buckets.write("0")


def no_new_privs() -> None:
    """No exec from here on gains privileges (setuid bits, file capabilities)."""
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def sibling_fork(new_pid_namespace: bool) -> Callable[[], int]:
    """A fork like os.fork(), but the child is our parent's (CLONE_PARENT), as glibc's fork makes it:
    the child's tid in its thread descriptor, Python's fork hooks and state on both sides.  With
    `new_pid_namespace` the child is PID 1 of a PID namespace of its own, below ours.  The system
    call's arguments are made once: each fork then writes as few of the caller's pages as it can."""
    number, tid_last = CLONE_CALL
    tid = ctypes.c_void_p(libc.pthread_self() + THREAD_TID_OFFSET)
    # The exit signal is our own's (SIGCHLD, to the parent we share).
    flags = ctypes.c_ulong(CLONE_PARENT | CLONE_CHILD_SETTID | (CLONE_NEWPID if new_pid_namespace else 0))
    arguments = (number, flags, None, None, *((None, tid) if tid_last else (tid, None)))
    clone, before, child, parent = (python_libc.syscall, ctypes.pythonapi.PyOS_BeforeFork,
                                    ctypes.pythonapi.PyOS_AfterFork_Child, ctypes.pythonapi.PyOS_AfterFork_Parent)

    def fork() -> int:
        before()
        pid: int = clone(*arguments)
        if pid == 0:
            child()
            return 0
        parent()
        if pid < 0:
            check(-1, "clone(CLONE_PARENT)")
        return pid

    return fork


def set_oom_score_adj(value: int, dumpable: bool) -> None:
    """This process's oom_score_adj.  Its /proc files are writable by it while it is dumpable, which
    a uid change made it not: it is dumpable for this write, then as `dumpable` says (see child.py
    where it is called).  Refused only below a floor a privileged writer set (oom_score_adj_min,
    which no child of ours sets)."""
    check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    try:
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adjust:
            adjust.write(str(value))
    finally:
        check(libc.prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0), "PR_SET_DUMPABLE")


def dumpable() -> bool:
    """Whether this process is dumpable (a uid change made it not)."""
    return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1)


def user_namespace(uid: int, gid: int) -> None:
    """A user namespace of this process's own, whose only ids are 0, mapped to `uid` and `gid` of the
    one it leaves.  It owns no other namespace, so the capabilities it gives are over nothing; and
    RLIMIT_NPROC counts a user namespace's processes apart from the one above (Linux 5.14+)."""
    check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1\n"), ("gid_map", f"0 {gid} 1\n")):
        with open(f"/proc/self/{name}", "w") as control:
            control.write(text)


def die_with_parent() -> None:
    """SIGKILL once the parent is gone."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")


def become_subreaper() -> None:
    """Orphans below this process come to it rather than escaping to init: the reaper without a PID namespace."""
    check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")


def kernel_version() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def reaped_exit_code(pidfd: int) -> Optional[int]:
    """The exit code (a signal's negated) of the process of `pidfd`, not our child, once its parent
    reaped it; None before that, or where the kernel does not keep it (before Linux 6.15)."""
    info = bytearray(PIDFD_INFO_BYTES)
    struct.pack_into("Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    except OSError:
        return None
    if not struct.unpack_from("Q", info, 0)[0] & PIDFD_INFO_EXIT:
        return None
    return os.waitstatus_to_exitcode(struct.unpack_from("i", info, PIDFD_EXIT_CODE_AT)[0])


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing, disabled or refused."""
    version: int = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(version, 0)


def set_name(name: bytes) -> None:
    """What `ps` shows for this process."""
    libc.prctl(PR_SET_NAME, name, 0, 0, 0)
