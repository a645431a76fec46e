"""A container's default profile, reproduced without a container engine: the server starts with
CAP_SYS_ADMIN out of its bounding set and under a seccomp filter that refuses unshare, setns,
every mount call and clone's namespace flags (clone3: ENOSYS), as Docker's default profile and
Kubernetes' RuntimeDefault do for a container without CAP_SYS_ADMIN.  Used as a preexec_fn."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

CAP_SYS_ADMIN = 21
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
REFUSED = ("unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig",
           "fsmount", "fspick", "mount_setattr")
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def enter() -> None:
    """Apply the profile to the calling process (and so to all it execs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EPERM:
        raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) == 0:
        for half in data:
            mask = ~(1 << CAP_SYS_ADMIN) & 0xFFFFFFFF
            half.effective &= mask
            half.permitted &= mask
            half.inheritable &= mask
        libc.capset(ctypes.byref(header), data)
    seccomp = ctypes.CDLL(ctypes.util.find_library("seccomp"), use_errno=True)
    seccomp.seccomp_init.restype = ctypes.c_void_p
    seccomp.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgCmp)]
    seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = ctypes.c_void_p(seccomp.seccomp_init(0x7FFF0000))
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS

    def rule(action: int, name: str, *compares: _ArgCmp) -> None:
        number = seccomp.seccomp_syscall_resolve_name(name.encode())
        if number >= 0:
            array = (_ArgCmp * max(1, len(compares)))(*compares)
            if seccomp.seccomp_rule_add_array(ctx, action, number, len(compares), array) != 0:
                raise OSError(f"seccomp rule for {name}")

    for name in REFUSED:
        rule(eperm, name)
    rule(enosys, "clone3")
    for flag in NAMESPACE_FLAGS:
        rule(eperm, "clone", _ArgCmp(0, 7, flag, flag))  # SCMP_CMP_MASKED_EQ
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or seccomp.seccomp_load(ctx) != 0:
        raise OSError("loading the container profile failed")
