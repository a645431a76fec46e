"""A job's processes as the zygote's /proc shows them: CPU use and wait, priority, memory."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from collections.abc import Collection, Iterable, Iterator
from typing import NamedTuple, Optional

from . import trees
from .wire import READ_CHUNK


def read(path: str, dir_fd: Optional[int] = None) -> bytes:
    """A /proc (or cgroup) file, read by descriptor: a Python file object costs four more system calls
    (an isatty probe, two seeks, a stat), several a session call."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)



def _stat_fields(path: str) -> list[bytes]:
    """A `stat` file's fields after the command name (which may hold spaces and parentheses): state first."""
    return read(path).rpartition(b")")[2].split()

def tree(pid: int, limit: int = 1024, skip: Collection[int] = ()) -> Iterator[int]:
    """`pid` and its descendants (children of every thread), but for those below `skip`."""
    stack = [pid]
    seen = 0
    while stack and seen < limit:
        current = stack.pop()
        seen += 1
        yield current
        stack.extend(child for child in children(current) if child not in skip)


def thread_of(pid: int, tid: int) -> bool:
    """Whether `tid` is a thread of process `pid` (itself included)."""
    return tid == pid or os.path.exists(f"/proc/{pid}/task/{tid}")


def children(pid: int) -> list[int]:
    """`pid`'s children, of every thread (one thread exiting meanwhile must not hide the others')."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(child) for child in read(f"/proc/{pid}/task/{task}/children").split())
        except (OSError, ValueError):
            continue
    return found


def name(pid: int) -> bytes:
    """What `ps` shows for `pid` (its comm), empty once it is gone."""
    try:
        return read(f"/proc/{pid}/comm").rstrip(b"\n")
    except OSError:
        return b""


def kill_all(pid: int) -> None:
    """SIGKILL every process below `pid`, walking again until a walk finds none not killed already,
    then `pid`.  A process with SIGKILL queued runs no more user code and forks no more (the kernel
    checks for it as it links a child in), and a child is read after its parent is killed: what one
    walk misses was reparented meanwhile to `pid` (a subreaper, or PID 1 of its namespace), which the
    next finds.  So `pid` is stopped first and killed last: had it exited during the walk, what it
    had below would have gone further up, unseen."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
    killed = {pid}
    try:
        for _ in range(64):
            fresh = False
            stack = children(pid)
            while stack:
                current = stack.pop()
                if current not in killed:
                    _kill(current)
                    killed.add(current)
                    fresh = True
                stack.extend(children(current))
            if not fresh:
                return
    finally:
        _kill(pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        # Its exit then runs beside the zygote rather than in its place (a woken task of equal
        # weight takes the waker's CPU: ~0.5 ms of teardown per run, measured).
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def cpu_time(pid: int) -> float:
    """CPU seconds of `pid` and of the children it waited for, as wait4 reports them once it ends."""
    return _usage(pid, [f"/proc/{pid}/task/{task}/schedstat" for task in _tasks(pid)])[0]


def cpu_of(pids: Iterable[int]) -> tuple[float, float]:
    """(seconds on a CPU summed over the processes `pids`, every thread and every child they waited
    for included; the longest any one of them waited for a CPU, as its main thread did: a run of many
    busy processes must not pass for a starved one by adding up their waits).  Two reads a process,
    however many threads it has."""
    cpu = wait = 0.0
    for pid in pids:
        used, waited = _usage(pid, [f"/proc/{pid}/schedstat"])
        cpu += used
        wait = max(wait, waited)
    return cpu, wait


def longest_wait(pids: Iterable[int]) -> float:
    """The longest any of the processes `pids` (its main thread) waited for a CPU: one read a process."""
    longest = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            longest = max(longest, int(read(f"/proc/{pid}/schedstat").split()[1]))
    return longest / 1e9


def renice_all(pids: Iterable[int]) -> None:
    """Every thread of the processes `pids` to nice 19."""
    for pid in pids:
        _renice(_tasks(pid))


def _renice(tasks: list[str]) -> None:
    for task in tasks:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(task), 19)


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _usage(pid: int, schedstats: list[str]) -> tuple[float, float]:
    """(CPU seconds of `pid` and of the children it waited for: what the `schedstat` files given
    (its threads', or its main thread's) count to the nanosecond, all its threads' and its children's
    to the clock tick; the longest any of those threads waited for a CPU)."""
    ran = longest = 0
    for path in schedstats:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = read(path).split()
            ran += int(fields[0])
            longest = max(longest, int(fields[1]))
    try:
        fields = _stat_fields(f"/proc/{pid}/stat")
        utime, stime, cutime, cstime = (int(field) for field in fields[11:15])
    except (OSError, ValueError):
        return ran / 1e9, longest / 1e9
    tick = os.sysconf("SC_CLK_TCK")
    return max(ran / 1e9, (utime + stime) / tick) + (cutime + cstime) / tick, longest / 1e9


def status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as its fields (State, TracerPid, Seccomp_filters, ...); {} once it is gone."""
    try:
        lines = read(f"/proc/{pid}/status").decode("ascii", "replace").splitlines()
    except OSError:
        return {}
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def parent(pid: int) -> int:
    """`pid`'s parent (0 if it is gone)."""
    try:
        return int(_stat_fields(f"/proc/{pid}/stat")[1])
    except (OSError, ValueError, IndexError):
        return 0


def ended(pid: int) -> bool:
    """Whether every thread of `pid` has exited (a zombie waiting to be reaped, or gone): it runs
    nothing more.  A leader that exited while its other threads run shows Z too, so each is read."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            if _stat_fields(f"/proc/{pid}/task/{task}/stat")[0] not in (b"Z", b"X"):
                return False
        except (OSError, IndexError):
            continue
    return True


class Memory(NamedTuple):
    used: int  # bytes
    hidden: list[int]  # processes whose memory the zygote may not read (not in `used`)
    sockets: set[int]  # inodes of the sockets the processes hold
    readable: int  # one of the processes whose /proc files the zygote may read (its namespaces'), or -1


def tree_memory(pid: int, skip: Collection[int] = (), own: Collection[int] = ()) -> Memory:
    """Bytes of anonymous and shared memory the job's processes hold, each page split between the
    processes that map it (PSS), so pages still shared with the warm interpreter barely count;
    plus their page tables, the memfds they hold open, mapped or not (a mapped one counts twice: the
    cap errs low), and the inodes of the sockets they hold (socket_memory.py counts what those queue).
    A process that made itself undumpable (`PR_SET_DUMPABLE` 0, or it runs a program it cannot read)
    closes them to a zygote of its uid without `CAP_SYS_PTRACE` (the landlock rung as an ordinary
    account): it is `hidden`, but for the job's `own` (they run no user code, undumpable by design)."""
    total = 0
    memfds = {}
    hidden = []
    sockets = set()
    readable = -1
    for current in tree(pid, skip=skip):
        try:
            try:
                rollup, where = _rollup(current)
            except PermissionError:
                if current not in own:
                    hidden.append(current)
                continue
            readable = current if readable < 0 else readable
            for line in rollup.splitlines():
                if line.startswith((b"Pss_Anon:", b"Pss_Shmem:")):
                    total += int(line.split()[1]) << 10
            total += _page_tables(where)
            for fd in os.listdir(f"{where}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"{where}/fd/{fd}")
                    if target.startswith("/memfd:"):
                        info = os.stat(f"{where}/fd/{fd}")
                        memfds[(info.st_dev, info.st_ino)] = info.st_blocks * 512
                    elif target.startswith("socket:["):
                        sockets.add(int(target[8:-1]))
        except (OSError, ValueError, IndexError):
            continue
    return Memory(total + sum(memfds.values()), hidden, sockets, readable)


def _page_tables(where: str) -> int:
    """Bytes of the process's page tables, which no mapping's count shows: one byte read every 2 MiB
    of a sparse read-only mapping makes a page of them (1 GB held against a 128 MB cap before)."""
    with open(f"{where}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmPTE:"):
                return int(line.split()[1]) << 10
    return 0


def _rollup(pid: int) -> tuple[bytes, str]:
    """`pid`'s smaps_rollup, and the /proc directory it was read through: a leader that ended its own
    thread (SYS_exit) reads as gone while its other threads run on with all of its memory."""
    try:
        return read(f"/proc/{pid}/smaps_rollup"), f"/proc/{pid}"
    except ProcessLookupError:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                return read(f"/proc/{pid}/task/{task}/smaps_rollup"), f"/proc/{pid}/task/{task}"
        raise


COUNT_TRIES = 3  # walks of a files count a run's moves may restart
OPENED_UP = stat.S_IRUSR | stat.S_IXUSR  # what a count adds to a directory it must list


class Counted(NamedTuple):
    size: int  # bytes of blocks
    entries: int  # names


def directory_size(path: str, stop_past: int, entries_past: int) -> Counted:
    """Bytes the files below `path` hold (their blocks), and their names, counted until past
    `stop_past` bytes or `entries_past` names.  Walked by
    descriptor (trees.walk), never through a symlink: the run owning the directory may swap one in
    meanwhile, or move a directory out from under the walk (then the count starts again, up to
    COUNT_TRIES times, and the largest count stands)."""
    try:
        top = os.open(path, trees.DIRECTORY)
    except OSError:
        return Counted(0, 0)
    counted = Counted(0, 0)
    try:
        for _ in range(COUNT_TRIES):
            count = _Count(stop_past, entries_past)
            try:
                trees.walk(top, count.enter, count.leave)
                return count.counted()
            except _Past:
                return count.counted()
            except trees.TreeMoved:
                counted = max(counted, count.counted())
            except OSError:
                return count.counted()  # the directory itself went (its job ended)
            finally:
                count.put_back()
    finally:
        os.close(top)
    return counted


class _Past(Exception):
    """The count passed what it was asked to count to."""


class _Count:
    """One walk's sum of blocks.  A directory its run made unreadable to us (on the landlock rung as
    an ordinary account the run is our uid; root reads them all) is opened for the count and its mode
    put back as the walk leaves it: a count that skipped it would let a run hide its files."""

    def __init__(self, stop_past: int, entries_past: int):
        self.stop_past = stop_past
        self.entries_past = entries_past
        self.total = 0
        self.entries = 0
        self.opened: list[Optional[tuple[int, int]]] = []  # per directory gone into: (an O_PATH, its mode) if opened up
        self.linked: set[int] = set()  # inodes of files with several names, counted once

    def counted(self) -> Counted:
        return Counted(self.total, self.entries)

    def enter(self, directory: int, name: str) -> Optional[int]:
        self.entries += 1
        if self.entries > self.entries_past:
            raise _Past
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                if info.st_nlink > 1:  # a hard link's blocks are on the disk once
                    if info.st_ino in self.linked:
                        return None
                    self.linked.add(info.st_ino)
                self.total += info.st_blocks * 512
                if self.total > self.stop_past:
                    raise _Past
                return None
            try:
                inner = os.open(name, trees.DIRECTORY, dir_fd=directory)
            except PermissionError:
                return self._open_up(directory, name)
        except OSError:
            return None  # gone, or swapped for what is not a directory, since it was listed
        self.opened.append(None)
        return inner

    def leave(self, directory: int, name: str) -> None:
        self._put_back(self.opened.pop())

    def put_back(self) -> None:
        while self.opened:
            self._put_back(self.opened.pop())

    def _open_up(self, directory: int, name: str) -> int:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        try:
            mode = stat.S_IMODE(os.fstat(handle).st_mode)
            os.chmod(f"/proc/self/fd/{handle}", mode | OPENED_UP)  # that very directory
            inner = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self._put_back((handle, -1))
            raise
        self.opened.append((handle, mode))
        return inner

    @staticmethod
    def _put_back(opened: Optional[tuple[int, int]]) -> None:
        if opened is None:
            return
        handle, mode = opened
        with contextlib.suppress(OSError):  # unless the run changed it meanwhile: then its own mode stands
            if mode >= 0 and stat.S_IMODE(os.fstat(handle).st_mode) == mode | OPENED_UP:
                os.chmod(f"/proc/self/fd/{handle}", mode)
        os.close(handle)


def unnamed_descriptors(pid: int) -> Iterator[tuple[int, os.stat_result]]:
    """The regular files `pid` holds open that have no name left (memfds, files unlinked while open):
    each descriptor and what it holds."""
    for entry in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            info = os.stat(f"/proc/{pid}/fd/{entry}")
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
                yield int(entry), info


def unnamed_files(pid: int, device: int, skip: Collection[int] = ()) -> int:
    """Bytes of files on `device` the job's processes hold, open or mapped, with no name left (unlinked
    while held): a count of a directory's names misses them, the disk does not.  A mapped one with no
    descriptor is counted at its mapping's extent."""
    sizes: dict[int, int] = {}
    mapped_on = f"{os.major(device):02x}:{os.minor(device):02x}".encode()
    for current in tree(pid, skip=skip):
        with contextlib.suppress(OSError):
            for _, info in unnamed_descriptors(current):
                if info.st_dev == device:
                    sizes[info.st_ino] = info.st_blocks * 512
            for line in read(f"/proc/{current}/maps").splitlines():
                fields = line.split()
                if line.endswith(b" (deleted)") and fields[3] == mapped_on:
                    start, end = (int(bound, 16) for bound in fields[0].split(b"-"))
                    sizes.setdefault(int(fields[4]), end - start)
    return sum(sizes.values())
