"""Files' modes and times, changed by a run only beneath its own directory, where runs are the
server's uid (the landlock rung as an ordinary account).

Landlock governs opening, making, linking and removing files, not `chmod`, `chown`, `utimensat`
or extended attributes: a run of the server's own uid could change the metadata of every file that
uid owns, anywhere (a red-team run made the account's files world-writable and chmodded its
zygote's directory so that every later run failed to start).  So there the template adds a filter
before it forks any child, which every process of every run and session inherits:

- changes of owner and of extended attributes are refused (EPERM): an ordinary account can give a
  file to no one else, and neither is what a run's own files need;
- `chmod`, `fchmod`, `fchmodat(2)` and `utimensat` are handed to the zygote, which makes the change
  itself on the file, if its directory is the calling run's or below it and its last component
  leads nowhere else (openat2 with RESOLVE_BENEATH from there), or answers EPERM; a descriptor's
  file (fchmod, futimens) must have been opened beneath it;
- the legacy `utime`, `utimes` and `futimesat` are refused (libc's own calls use `utimensat`), and so
  are the ioctls that set an inode's flags (`chattr`) on a descriptor the run may hold only to read.

The zygote acts with the run's rights (the same uid), on its own copy of the path (read once from
the run's memory, so no other thread of the run can change it under the check), and never follows
a path of the run's out of its directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import socket
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any, Optional

from .exits import (
    NOTIFICATION,
    RESPONSE,
    SECCOMP_FILTER_FLAG_NEW_LISTENER,
    SECCOMP_IOCTL_NOTIF_RECV,
    SECCOMP_IOCTL_NOTIF_SEND,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_USER_NOTIF,
    SECCOMP_SET_MODE_FILTER,
    SYSCALLS,
)
from .linux import AT_FDCWD, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, SYS_OPENAT2, OpenHow, libc, no_new_privs
from .wire import readable

SECCOMP_IOCTL_NOTIF_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_ABS_W, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
X32_SYSCALL_BIT = 0x40000000
SYS_PIDFD_GETFD = 438
AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH = 0x100, 0x1000
PATH_MAX = 4096
MAX_DEPTH = 1 << 16  # levels a changed file's directory may be below a named one (a run's whole tree fits)
JUMP = 1024  # `..` steps in one open: "../" 1,024 times is 3 KiB, under PATH_MAX
OWN_DESCRIPTOR = re.compile(r"/(?:proc/(?:self|thread-self)|dev)/fd/([0-9]{1,9})")
TURN = 0.002  # seconds of calls answered per wake-up: a run calling chmod in a loop holds up no other work

# Per architecture: the calls handed to the zygote, by name, and those refused outright.
HANDED = {
    "x86_64": {90: "chmod", 91: "fchmod", 268: "fchmodat", 452: "fchmodat2", 280: "utimensat"},
    "aarch64": {52: "fchmod", 53: "fchmodat", 452: "fchmodat2", 88: "utimensat"},
}
REFUSED = {  # EPERM: chown fchown lchown fchownat, and the legacy utime utimes futimesat
    "x86_64": (92, 93, 94, 260, 132, 235, 261),
    "aarch64": (55, 54),
}
UNSUPPORTED = {  # EOPNOTSUPP, which `cp -p` takes for a file system without ACLs: setxattr lsetxattr
    # fsetxattr removexattr lremovexattr fremovexattr setxattrat removexattrat
    "x86_64": (188, 189, 190, 197, 198, 199, 463, 466),
    "aarch64": (5, 6, 7, 14, 15, 16, 463, 466),
}


IOCTL = {"x86_64": 16, "aarch64": 29}
# EPERM: an inode's flags (chattr: +S made the account's files synchronous) and its fsxattr, by ioctl on a
# descriptor opened only to read. FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR.
FLAG_IOCTLS = (0x40086602, 0x40046602, 0x401C5820)
IOCTL_COMMAND = 24  # seccomp_data.args[1], its low 32 bits (the kernel takes the command as unsigned int)


def _program(machine: str) -> Optional[bytes]:
    known = SYSCALLS.get(machine)
    if known is None:
        return None
    groups = [(sorted(HANDED[machine]), 1), (REFUSED[machine], 2), (UNSUPPORTED[machine], 3)]
    # [arch?] [nr] [x32?] checks... [ioctl?] [command] commands... then ALLOW, NOTIFY, EPERM, EOPNOTSUPP
    allow = 4 + sum(len(numbers) for numbers, _ in groups) + 2 + len(FLAG_IOCTLS)
    instructions = [(BPF_LD_ABS_W, 0, 0, 4), (BPF_JEQ_K, 0, allow - 2, known[2]), (BPF_LD_ABS_W, 0, 0, 0),
                    (BPF_JGE_K, allow + 2 - 4, 0, X32_SYSCALL_BIT)]
    for numbers, outcome in groups:
        for number in numbers:
            instructions.append((BPF_JEQ_K, allow + outcome - len(instructions) - 1, 0, number))
    instructions.append((BPF_JEQ_K, 0, allow - len(instructions) - 1, IOCTL[machine]))
    instructions.append((BPF_LD_ABS_W, 0, 0, IOCTL_COMMAND))
    for command in FLAG_IOCTLS:
        instructions.append((BPF_JEQ_K, allow + 2 - len(instructions) - 1, 0, command))
    instructions += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, SECCOMP_RET_USER_NOTIF),
                     (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
                     (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EOPNOTSUPP)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install() -> int:
    """In the template, before it forks any child: the filter, and its listener for the zygote."""
    machine = os.uname().machine
    program = _program(machine)
    if program is None:
        raise OSError(errno.ENOSYS, f"no metadata filter for {machine}: runs would change the server's files")
    no_new_privs()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_char_p))
    listener: int = libc.syscall(SYSCALLS[machine][0], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                                 ctypes.byref(fprog))
    if listener < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"the metadata filter: {os.strerror(err)}")
    return listener


def send(channel: socket.socket, listener: int) -> None:
    socket.send_fds(channel, [b"metadata"], [listener])
    os.close(listener)


def receive(channel: socket.socket) -> int:
    _, fds, _, _ = socket.recv_fds(channel, 64, 1)
    if not fds:
        raise OSError(errno.EPROTO, "the template sent no metadata listener")
    os.set_inheritable(fds[0], False)
    return fds[0]


class Refused(Exception):
    def __init__(self, number: int):
        super().__init__(os.strerror(number))
        self.errno = number


class MetadataCalls:
    """The zygote's side: each call handed over, made beneath its run's directory or refused.
    `directories()` names each job's PID 1 and its directory."""

    def __init__(self, listener: int, directories: Callable[[], dict[int, str]]):
        self.listener = listener
        self.directories = directories
        self.zygote_pid = os.getpid()
        self.names = HANDED.get(os.uname().machine, {})

    def on_event(self, zygote: Any, fd: int) -> None:
        until = time.monotonic() + TURN
        directories = self.directories()  # once a wake-up: no job starts or ends meanwhile
        while True:
            buffer = bytearray(NOTIFICATION.size)
            try:
                fcntl.ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, buffer, True)
            except OSError:
                return  # the caller died meanwhile
            notice_id, pid, _, number, _, _, *args = NOTIFICATION.unpack(buffer)
            try:
                self._answer(notice_id, self._directory(pid, directories), pid, self.names.get(number, ""), args)
                error = 0
            except Refused as exc:
                error = exc.errno
            except OSError as exc:
                error = exc.errno or errno.EPERM
            except Exception:  # a call's arguments this code did not foresee: refused, never the zygote's end
                error = errno.EPERM
            with contextlib.suppress(OSError):  # ENOENT: the caller was killed meanwhile
                fcntl.ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, bytearray(RESPONSE.pack(notice_id, 0, -error, 0)), True)
            if time.monotonic() > until or not readable(fd):
                return

    def _answer(self, notice_id: int, root: str, pid: int, name: str, args: list[int]) -> None:
        dirfd = ctypes.c_int32(args[0] & 0xFFFFFFFF).value
        times: Optional[bytes] = None
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
            self._check(notice_id)  # the pid is still the caller's: its memory is the caller's
            if name == "chmod":
                (target, last), mode, flags = self._path(pid, root, AT_FDCWD, _string(memory, args[0]), 0), args[1], 0
            elif name == "fchmod":
                (target, last), mode, flags = (self._descriptor(pid, root, dirfd, plain=True), ""), args[1], 0
            elif name in ("fchmodat", "fchmodat2"):
                flags = args[3] if name == "fchmodat2" else 0
                (target, last), mode = self._at(pid, root, dirfd, memory, args[1], flags), args[2]
            elif name == "utimensat":
                flags, mode = args[3], 0
                (target, last) = ((self._descriptor(pid, root, dirfd, plain=True), "") if not args[1] else
                                  self._at(pid, root, dirfd, memory, args[1], flags))
                times = _read(memory, args[2], 32) if args[2] else None
            else:
                raise Refused(errno.EPERM)
        try:
            self._check(notice_id)
            # `last`: an entry of the checked directory `target`, changed itself (AT_SYMLINK_NOFOLLOW),
            # whatever the run swaps in there meanwhile; else `target` is the file.
            at, path, nofollow = (target, last.encode(errors="surrogateescape"), AT_SYMLINK_NOFOLLOW) if last else \
                (AT_FDCWD, b"/proc/self/fd/%d" % target, 0)  # the file itself: an O_PATH descriptor takes no fchmod
            if name == "utimensat":
                times_buffer = ctypes.create_string_buffer(times, 32) if times else None
                done = libc.utimensat(at, path, times_buffer, nofollow)
            else:  # libc's fchmodat: a symlink's own mode is EOPNOTSUPP, as the kernel says
                done = libc.fchmodat(at, path, mode & 0o7777, nofollow)
            if done != 0:
                raise Refused(ctypes.get_errno())
        finally:
            os.close(target)

    def _check(self, notice_id: int) -> None:
        try:
            fcntl.ioctl(self.listener, SECCOMP_IOCTL_NOTIF_ID_VALID, struct.pack("=Q", notice_id))
        except OSError:
            raise Refused(errno.ESRCH) from None

    def _directory(self, pid: int, directories: dict[int, str]) -> str:
        """The directory of the run (or session) `pid` is a process of: its ancestors up to a job's PID 1,
        a child of ours; EPERM where there is none (an orphan handed to us)."""
        pid = _process(pid)  # a thread's parent is its process's
        for _ in range(4096):
            if pid in directories:
                return directories[pid]
            parent = _parent(pid)
            if parent in (0, 1, self.zygote_pid):
                break
            pid = parent
        raise Refused(errno.EPERM)

    def _at(self, pid: int, root: str, dirfd: int, memory: Any, address: int, flags: int) -> tuple[int, str]:
        if flags & ~(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH):
            raise Refused(errno.EINVAL)
        path = _string(memory, address)
        if not path and flags & AT_EMPTY_PATH:
            return self._descriptor(pid, root, dirfd, plain=False), ""
        return self._path(pid, root, dirfd, path, flags)

    def _path(self, pid: int, root: str, dirfd: int, path: str, flags: int) -> tuple[int, str]:
        """`path` as the caller names it, if its directory is beneath `root`: an O_PATH descriptor of the
        file and "" (its last component may not lead out of that directory), or, not to follow it, one of
        the directory and that last component."""
        if not path:
            raise Refused(errno.ENOENT)
        own = OWN_DESCRIPTOR.fullmatch(path)
        if own:  # the caller's descriptor (glibc's fchmodat without fchmodat2): /proc/self here would be ours
            return self._descriptor(pid, root, int(own[1]), plain=False), ""
        if not path.startswith("/") and dirfd != AT_FDCWD and dirfd < 0:
            raise Refused(errno.EBADF)
        start = "/" if path.startswith("/") else f"/proc/{pid}/cwd" if dirfd == AT_FDCWD else f"/proc/{pid}/fd/{dirfd}"
        head, _, last = path.rstrip("/").rpartition("/")
        if last in ("", ".", ".."):
            head, last = path, ""  # the directory itself
        elif path.endswith("/"):  # a directory, followed to whatever it names, as the kernel does
            flags = flags & ~AT_SYMLINK_NOFOLLOW
        try:
            base = os.open(start, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the caller's own, through /proc
        except FileNotFoundError:
            raise Refused(errno.EBADF) from None  # no such descriptor
        try:
            directory = _open(base, head or ".", os.O_DIRECTORY, RESOLVE_NO_MAGICLINKS)
        finally:
            os.close(base)
        try:
            _inside(directory, root)
            if not last:
                return os.dup(directory), ""
            if flags & AT_SYMLINK_NOFOLLOW:
                return os.dup(directory), last
            kind = os.O_DIRECTORY if path.endswith("/") else 0
            return _open(directory, last, kind, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), ""
        finally:
            os.close(directory)

    def _descriptor(self, pid: int, root: str, number: int, plain: bool) -> int:
        """The caller's descriptor `number`, if its file was opened beneath `root`; `plain`: not an O_PATH
        one (fchmod and futimens take none)."""
        pidfd = os.pidfd_open(_process(pid))  # the caller may be a thread: its process holds the table
        try:
            fd: int = libc.syscall(SYS_PIDFD_GETFD, pidfd, number, 0)
        finally:
            os.close(pidfd)
        if fd < 0:
            raise Refused(ctypes.get_errno())
        try:
            if plain and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
                raise Refused(errno.EBADF)
            if not _beneath(root, os.readlink(f"/proc/self/fd/{fd}")):
                raise Refused(errno.EPERM)
        except BaseException:
            os.close(fd)
            raise
        return fd


def directories_of(jobs: Iterable[Any]) -> dict[int, str]:
    """Each job's PID 1 and its directory; a fork's is its source session's."""
    found = {}
    for job in jobs:
        source = job
        while not source.files_dir and getattr(source, "parent", None) is not None:
            source = source.parent
        if job.pid > 0 and source.files_dir:
            found[job.pid] = source.files_dir
    return found


def _open(directory: int, path: str, flags: int, resolve: int) -> int:
    how = OpenHow(os.O_PATH | os.O_CLOEXEC | flags, 0, resolve)
    fd: int = libc.syscall(SYS_OPENAT2, directory, path.encode(errors="surrogateescape"), ctypes.byref(how),
                           ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise Refused(errno.EPERM if err == errno.EXDEV else err)  # a `..` or symlink out of the directory
    return fd


def _inside(directory: int, root: str) -> None:
    """EPERM unless `directory` is `root` or below it (a run can move nothing of its own out of its
    directory, nor anything into it: Landlock).  Its path says so, or, in a tree deeper than a path can
    be, the path of an ancestor that has one, and where the root would be on the way up to it."""
    path, climbed = _path_of(directory), 0
    if path is None:
        path, climbed = _named_ancestor(directory)
    if _beneath(root, path):
        return None
    if not climbed:
        raise Refused(errno.EPERM)
    # Else the root is beneath that ancestor, `below` levels down, or nowhere above the directory.
    below = root.count("/") - path.rstrip("/").count("/")
    if not root.startswith(path.rstrip("/") + "/") or below > climbed:
        raise Refused(errno.EPERM)
    candidate = _up(directory, climbed - below)
    try:
        here, top = os.fstat(candidate), os.stat(root)
    finally:
        os.close(candidate)
    if (here.st_dev, here.st_ino) != (top.st_dev, top.st_ino):
        raise Refused(errno.EPERM)
    return None


def _named_ancestor(directory: int) -> tuple[str, int]:
    """The path of an ancestor of `directory` that has one, and how many levels up it is.  Past the top
    every climb lands on `/`: a climb that does is searched back, and a level below the top has a path
    (each level shortens a path by 256 bytes at most)."""
    low, high = 0, 0  # a level with no path (never past the top), and one found past it (0: none yet)
    while True:
        level = (low + high) // 2 if high else low + JUMP
        if level > MAX_DEPTH or level == low:
            raise Refused(errno.EPERM)
        path = _path_at(directory, level)
        if path is None:
            low = level
        elif path != "/":
            return path, level
        else:
            high = level


def _path_at(directory: int, levels: int) -> Optional[str]:
    ancestor = _up(directory, levels)
    try:
        return _path_of(ancestor)
    finally:
        os.close(ancestor)


def _path_of(directory: int) -> Optional[str]:
    """Where a descriptor's file is; None past what a path can say."""
    try:
        return os.readlink(f"/proc/self/fd/{directory}")
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return None
        raise


def _up(directory: int, levels: int) -> int:
    """The directory `levels` above `directory` (past the top, the top)."""
    current = os.dup(directory)
    while levels > 0:
        step = min(levels, JUMP)
        try:
            higher = os.open("/".join([".."] * step), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=current)
        finally:
            os.close(current)
        current, levels = higher, levels - step
    return current


def _beneath(root: str, path: str) -> bool:
    """Whether `path` is `root` or below it."""
    return path == root or path.startswith(root + "/")


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as status:
            return int(status.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _process(tid: int) -> int:
    with open(f"/proc/{tid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise Refused(errno.ESRCH)


def _read(memory: Any, address: int, size: int) -> bytes:
    try:
        data: bytes = os.pread(memory.fileno(), size, address)
    except (OSError, OverflowError):  # past the address space, or past a file offset (2**63)
        raise Refused(errno.EFAULT) from None
    if len(data) < size:
        raise Refused(errno.EFAULT)
    return data


def _string(memory: Any, address: int) -> str:
    """A NUL-terminated path from the caller's memory, read a page at a time (the next may be unmapped)."""
    if not address:
        raise Refused(errno.EFAULT)
    data = b""
    while len(data) < PATH_MAX:
        step = 4096 - (address + len(data)) % 4096
        try:
            chunk = os.pread(memory.fileno(), step, address + len(data))
        except (OSError, OverflowError):
            raise Refused(errno.EFAULT) from None
        if not chunk:
            raise Refused(errno.EFAULT)
        end = chunk.find(b"\0")
        if end >= 0:
            return (data + chunk[:end]).decode(errors="surrogateescape")
        data += chunk
    raise Refused(errno.ENAMETOOLONG)
