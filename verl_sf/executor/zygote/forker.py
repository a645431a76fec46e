"""Forking an idle session: copies of its interpreter, each in namespaces, files and cgroups of its own.

The state lives in the session's interpreter, which runs model code with no capabilities, so the
copy is made there: a throwaway forker stops it between calls (ptrace) and makes clone(2) in its
name: the seccomp filter hands clone with namespace flags to its tracer, which only the forker can
be (seccomp.py), so no secret admits it.  A clone that
makes a user namespace needs no capability, and the copy, stopped, is set up before it runs a step:
from outside, helpers map its ids, move it into its cgroups, and mount its own /proc, /dev/pts and
fresh tmpfs holding copies of the parent's files (read by descriptor, never through a path the
session planted), and bring up the loopback of its network.  The copy is PID 1 there and a child
of the session's PID 1 (CLONE_PARENT), so it outlives the parent's interpreter; in its name the
forker drops its capabilities, forks the new session's interpreter and execs a reaper.  The
interpreter takes pipes of its own to the zygote, its working directory and a process group, and
carries on from where the parent waited for its next call.

The parent enters a Landlock domain of its own after each fork (scoped signals, ABI 6), so it can
neither signal nor trace its copies, though it owns their user namespaces (where the kernel cannot
scope signals, that call fails and no copy is kept); copies cannot see one another (PID
namespaces of their own).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import stat
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn, Optional

from . import linux, procfs, tracing, trees
from .child import Blueprint
from .linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_REC,
)
from .messages import PROCESS_LIMIT
from .run_groups import Groups, write

FORK_FLAGS = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
CLONE_PARENT, SIGCHLD = 0x8000, 17
# What a fork's PID 1 becomes (exec'd, so no code of the session's runs in it): a reaper that lives
# while anything below it does.
# Every signal blocked: a kill from outside (the zygote's interrupt of a process group) never ends it.
# Its oom_score_adj back to 0, as the first session's PID 1 has it (linux.set_oom_score_adj).
REAPER = ("import os, signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())\n"
          "try:\n with open('/proc/self/oom_score_adj', 'w') as f: f.write('0')\nexcept OSError: pass\n"
          "while True:\n try: os.wait()\n except ChildProcessError: break")
PR_SET_KEEPCAPS, PR_SET_SECUREBITS = 8, 28
# SECBIT_NOROOT, SECBIT_KEEP_CAPS_LOCKED and SECBIT_NO_CAP_AMBIENT_RAISE, with their locks.
LOCKED_SECUREBITS = 0x1 | 0x2 | 0x20 | 0x40 | 0x80
LANDLOCK_SCOPES = 0x3  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL (ABI 6)
CHANNELS = (1, 2, 3, 9)  # stdout, stderr, records, calls: each copy gets its own
STATELESS_DEVICES = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9)}  # null, zero, full, random, urandom


class CopyFailed(OSError):
    """The copies could not be made; none is left behind."""


class Refused(CopyFailed):
    """The session's state forbids a fork now (answered 409): it is let go as it was."""


class TooDeep(Refused):
    """A fork of a fork of ... past what the kernel nests."""


class ProcessLimit(CopyFailed):
    """A process of a copy could not be made: the account is at its process limit (EAGAIN; answered 503)."""

    def __init__(self) -> None:
        super().__init__(f"a process of a copy could not be made: {PROCESS_LIMIT}; fewer copies, or fewer live "
                         "sessions, fit")


PROCESS_LIMIT_STATUS = 75  # EX_TEMPFAIL: a set-up helper that met the process limit, to its parent
REFUSED_STATUS = 76  # a set-up helper that met what the session holds (its files do not fit): the client's to mend
LINKS_KEPT = 1024  # files with several names whose copies keep them one file (past it, each name a copy)


def fork(blueprint: Blueprint, parent: int, groups: list[Groups], freeze: bool, parent_frozen: bool,
         reply: socket.socket) -> NoReturn:
    """In the forker (a child of the zygote): make len(groups) copies of `parent`, send the zygote
    each one's pid and zygote-side channel ends, and exit.  On failure, kill what was made."""
    made: list[int] = []
    try:
        # Nothing of the session's may reach into us (a core, /proc/<pid>/mem of the same uid).
        linux.check(linux.libc.prctl(linux.PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
        # Between calls a python session reads them on fd 9, bash on fd 0 (`read <&9`); a snapshot
        # stands stopped on that read, and is never let go to reach it.
        _check_untouched(parent)
        try:
            source = tracing.Tracee(parent, reading=() if parent_frozen else (0, 9))
        except tracing.NotIdle as exc:
            raise Refused(f"its interpreter is not waiting for its next call ({exc})") from None
        try:
            # Checked with the interpreter stopped, so they hold until the copies exist: nothing of
            # the session runs while we trace it and its clone makes namespaces.
            _check_alone(parent)
            cwd = _working_directory(parent, blueprint.cfg["workdir"])
            for copy_groups in groups:
                # A child of the session's PID 1 (CLONE_PARENT): it outlives the parent's interpreter.
                result = source.call("clone", FORK_FLAGS | CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
                if -result in (errno.EUSERS, errno.ENOSPC):
                    raise TooDeep(f"forks nest only so deep (Linux allows 32 user and PID namespaces, the "
                                  f"sandbox and its sessions use some): {os.strerror(-result)}")
                if -result == errno.EAGAIN:
                    raise ProcessLimit()
                if result < 0:
                    raise tracing.TraceError(-result, f"clone: {os.strerror(-result)}")
                assert source.forked is not None
                made.append(source.forked)
                init = tracing.Tracee(source.forked, attach=False)
                interpreter, fds = _set_up(blueprint, init, source, copy_groups, cwd, freeze)
                socket.send_fds(reply, [b"%d %d" % (init.pid, interpreter)], fds)
                for fd in fds:
                    os.close(fd)
            # A snapshot runs nothing: it needs no domain of its own (Landlock allows 16 in a line).
            if not parent_frozen:
                _own_domain(source)
        finally:
            source.resume_as(source.saved, source.mask, stop=parent_frozen)
        os._exit(0)
    except BaseException as exc:
        for pid in made:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        message = str(exc) if isinstance(exc, OSError) else traceback.format_exc()
        kind = b"busy " if isinstance(exc, Refused) else b"limit " if isinstance(exc, ProcessLimit) else b"error "
        with contextlib.suppress(OSError):
            reply.sendall(kind + message.replace("\n", " ").encode(errors="replace") + b"\n")
        os._exit(1)


def _check_untouched(interpreter: int) -> None:
    """The session's code has not traced its interpreter (a tracer of its own keeps ours out) nor
    loaded a seccomp filter of its own beside its PID 1's (it would refuse what a fork does in the
    interpreter's name): either is the session's doing, refused as such."""
    own, init = procfs.status(interpreter), procfs.status(procfs.parent(interpreter))
    if own.get("TracerPid", "0") != "0":
        raise Refused("its code made its interpreter traced (ptrace), and a traced process cannot be forked")
    if own.get("Seccomp_filters") != init.get("Seccomp_filters"):
        raise Refused("its code loaded a seccomp filter of its own, which would refuse what a fork does in its "
                      "interpreter's name")


def _check_alone(interpreter: int) -> None:
    """The stopped interpreter is the session's one thread and one process: no thread of its, no
    running child (one that exited unreaped runs nothing), no orphan taken in by the session's PID 1
    (whose other children, the session's copies, live in PID namespaces of their own) could run while
    the fork is made.  And it shares no
    writable memory that its copies would go on sharing."""
    threads = os.listdir(f"/proc/{interpreter}/task")
    if threads != [str(interpreter)]:
        raise Refused(f"its interpreter runs {len(threads)} threads; fork(2) copies only the one that takes calls, "
                      "so the copies would wait forever on what the others hold")
    children = procfs.children(interpreter)
    init = procfs.parent(interpreter)
    # PID 1's other children in the session's PID namespace are as deep as the interpreter; its copies
    # are deeper (one that is still ending, a failed fork's, may be out of our reach to inspect further).
    depth = len(procfs.status(interpreter).get("NSpid", "").split())
    for pid in procfs.children(init):
        if pid != interpreter and len(procfs.status(pid).get("NSpid", "").split()) == depth:
            children.append(pid)
    children = [pid for pid in children if not procfs.ended(pid)]  # a zombie runs nothing
    if children:
        raise Refused(f"it has {len(children)} background process(es), which a fork does not copy and which "
                      "could reach the copies: end them first")
    closed = [name for fd, name in ((1, "stdout"), (2, "stderr"))
              if not os.path.lexists(f"/proc/{interpreter}/fd/{fd}")]
    if closed:
        raise Refused(f"it closed its {' and '.join(closed)}, which a copy's output goes to: reopen "
                      f"{'them' if len(closed) > 1 else 'it'} first (os.dup2 of a file onto 1 or 2)")
    unnamed = _unnamed_files(interpreter)
    if unnamed:
        raise Refused(f"it holds {len(unnamed)} open file(s) that no path reaches ({', '.join(sorted(unnamed)[:3])}): "
                      "a fork would leave them shared with its copies, a channel between them whose pages none of "
                      "them is charged for (a memfd, a file deleted while open); close them first")
    shared = _shared_writable_mappings(interpreter)
    if shared:
        raise Refused(f"it maps {len(shared)} shared writable region(s) ({', '.join(sorted(set(shared))[:3])}): a "
                      "fork would share them with its copies, uncharged to any of them (mmap MAP_SHARED, shared "
                      "memory, multiprocessing's semaphores); unmap or close them first")


def _unnamed_files(pid: int) -> list[str]:
    """Regular files the process holds open that have no name left (memfds, files deleted while
    open): unlike a named file on its tmpfs, a copy could not reopen one of its own.  Its stdin (a
    memfd the session makes anew for each call, only read) is not one of them."""
    names = []
    for fd, _ in procfs.unnamed_descriptors(pid):
        if fd != 0 and fd not in CHANNELS:
            with contextlib.suppress(OSError):
                names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return names


def _shared_writable_mappings(pid: int) -> list[str]:
    """What the process maps shared and writable, by name (fork(2) would leave it shared)."""
    names = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if "w" in fields[1] and fields[1].endswith("s"):
                names.append(fields[5].strip() if len(fields) > 5 else "anonymous")
    return names


def _working_directory(pid: int, fallback: str) -> str:
    path = os.readlink(f"/proc/{pid}/cwd")
    return fallback if path.endswith(" (deleted)") else path


def _set_up(blueprint: Blueprint, init: tracing.Tracee, source: tracing.Tracee, groups: Groups, cwd: str,
            freeze: bool) -> tuple[int, list[int]]:
    """Make one stopped copy (PID 1 of its new namespaces) a session of its own: set up from
    outside, it loses its capabilities, forks the interpreter and becomes a reaper.  The
    interpreter's pid and the zygote's ends of its channels."""
    cfg = blueprint.cfg
    ids = "0 0 1" if cfg["single_uid"] else f"{cfg['uid']} {cfg['uid']} 1"
    token = os.urandom(8).hex()  # not `secrets`: it imports `random`, whose fork hook every run would pay
    fifos = [f"{cfg['tmpdir']}/.verl-sf-fork-{token}-{fd}" for fd in CHANNELS]
    _run_helper(lambda: _map_ids(source.pid, init.pid, ids))
    _run_helper(lambda: _helper(blueprint, init.pid, groups, fifos))
    _drop_capabilities(init)
    init.check("clone", SIGCHLD, 0, 0, 0, 0)
    assert init.forked is not None
    copy = tracing.Tracee(init.forked, attach=False)
    ends = _channels(copy, source, fifos)
    _reopen_files(copy, source, blueprint.tmpfs_targets)
    _close_reaching_parent(copy, _unchanging_mounts(copy.pid, blueprint.tmpfs_targets))
    address = copy.put(os.fsencode(cwd) + b"\0")
    if copy.call("chdir", address) < 0:
        copy.check("chdir", copy.put(cfg["workdir"].encode() + b"\0"))
    copy.check("setsid")  # its own process group, which an interrupt goes to
    if not freeze:  # out of reach of its PID 1 (ptrace, /proc, signals), as the parent is of it
        _own_domain(copy)
    copy.resume_as(source.saved, source.mask, stop=freeze)
    _become_reaper(init)
    return copy.pid, ends


def _drop_capabilities(process: tracing.Tracee) -> None:
    """All of them, for good (it made a user namespace, so it had them all, and a full bounding
    set): no exec gives uid 0 any (the securebits, locked), none can be raised, no_new_privs holds."""
    process.check("prctl", PR_SET_SECUREBITS, LOCKED_SECUREBITS)
    header = process.put(bytes(linux.CapHeader(linux.CAPABILITY_VERSION_3, 0)))
    process.check("capset", header, process.put(bytes(24), 64))


def _become_reaper(init: tracing.Tracee) -> None:
    """No descriptor of the session's kept, out of its process group, then an exec of the reaper; let go."""
    init.check("close_range", 0, 2**32 - 1, 0)
    init.check("setsid")
    strings = [sys.executable.encode(), b"-S", b"-I", b"-c", REAPER.encode()]
    addresses, offset = [], 0
    for text in strings:
        addresses.append(init.put(text + b"\0", offset))
        offset += len(text) + 1
    argv = init.put(b"".join(address.to_bytes(8, "little") for address in [*addresses, 0]), (offset + 15) & ~15)
    failed = -init.call("execve", addresses[0], argv, argv + 8 * len(strings))
    if failed > 0:  # no room for the reaper's arguments: a stack limit the session's code set, inherited
        raise Refused(f"a copy could not start ({os.strerror(failed)}): what the session's code set in its "
                      "interpreter (a stack limit) lets no copy of it run; restore it first")
    init.detach()


def _channels(copy: tracing.Tracee, source: tracing.Tracee, fifos: list[str]) -> list[int]:
    """The copy's stdout, stderr, records and calls on pipes of its own; the zygote's ends."""
    root = f"/proc/{copy.pid}/root"
    ends: list[int] = []
    for fd, path in zip(CHANNELS, fifos, strict=True):
        address = copy.put(os.fsencode(path) + b"\0")
        if fd == 9:  # the zygote writes, the copy reads: the reader opens first, without waiting
            theirs = copy.check("open", address, os.O_RDONLY | os.O_NONBLOCK)
            ours = os.open(root + path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            copy.check("fcntl", theirs, fcntl.F_SETFL, 0)
        else:
            ours = os.open(root + path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            theirs = copy.check("open", address, os.O_WRONLY)
            os.set_blocking(ours, True)
        copy.check("dup2", theirs, fd)
        copy.check("close", theirs)
        os.unlink(root + path)
        ends.append(ours)
    # Copies of the parent's channels on other numbers (bash reads its calls through `<&9`, on fd 0)
    # take the copy's own.
    channels = {os.readlink(f"/proc/{source.pid}/fd/{fd}"): fd for fd in CHANNELS}
    for entry in os.listdir(f"/proc/{copy.pid}/fd"):
        with contextlib.suppress(OSError):
            target = channels.get(os.readlink(f"/proc/{copy.pid}/fd/{entry}"))
            if target is not None and int(entry) not in CHANNELS:
                copy.check("dup2", target, int(entry))
    return ends


def _reopen_files(copy: tracing.Tracee, source: tracing.Tracee, mounts: list[str]) -> None:
    """Files the session holds open on its tmpfs or on a read-only mount, reopened as the copy's own
    (at the same offset, with the same flags, by the copy itself): else parent and copy would write
    one file, and share one offset (a channel: one seeks, the other reads where it is)."""
    reopenable = _unchanging_mounts(source.pid, mounts)
    for entry in os.listdir(f"/proc/{copy.pid}/fd"):
        try:
            info = os.stat(f"/proc/{copy.pid}/fd/{entry}")
            path = os.readlink(f"/proc/{copy.pid}/fd/{entry}")
            with open(f"/proc/{copy.pid}/fdinfo/{entry}") as fdinfo:
                fields = dict(line.split(":", 1) for line in fdinfo.read().splitlines() if ":" in line)
            flags, mount = int(fields["flags"], 8), int(fields["mnt_id"])
        except (OSError, KeyError, ValueError):
            continue  # closed below
        if int(entry) in CHANNELS or mount not in reopenable or not stat.S_ISREG(info.st_mode) \
                or flags & os.O_PATH or path.endswith(" (deleted)"):
            continue
        reopened = copy.call("open", copy.put(os.fsencode(path) + b"\0"),
                             flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))
        if reopened < 0:
            continue  # moved or made unreadable since: closed below, never shared
        copy.check("lseek", reopened, int(fields["pos"]), os.SEEK_SET)
        copy.check("dup2", reopened, int(entry))
        copy.check("close", reopened)


def _close_reaching_parent(copy: tracing.Tracee, unchanging: set[int]) -> None:
    """Every descriptor the copy inherited but its own channels, the files reopened above (on its
    `unchanging` mounts: read-only or its own tmpfs) and the stateless devices.  All else reaches the
    parent or the other copies: sockets, pipes, FIFOs, ptys, eventfds, timerfds, epoll and inotify
    instances, message queues, files a copy could not reopen (a channel between sessions, over which
    a unix socket passes any descriptor, a copy's /workdir among them); and directories, O_PATH
    handles, /proc files, pidfds and namespace files, which reach the parent's mount tree and processes."""
    own = set()
    for fd in CHANNELS:
        with contextlib.suppress(OSError):
            own.add(os.readlink(f"/proc/{copy.pid}/fd/{fd}"))
    for entry in os.listdir(f"/proc/{copy.pid}/fd"):
        try:
            info = os.stat(f"/proc/{copy.pid}/fd/{entry}")
            target = os.readlink(f"/proc/{copy.pid}/fd/{entry}")
            with open(f"/proc/{copy.pid}/fdinfo/{entry}") as fdinfo:
                fields = dict(line.split(":", 1) for line in fdinfo.read().splitlines() if ":" in line)
            flags, mount = int(fields["flags"], 8), int(fields["mnt_id"])
        except (OSError, KeyError, ValueError):  # gone since the listing, or unreadable: closed all the same
            copy.call("close", int(entry))
            continue
        if int(entry) in CHANNELS or target in own:
            continue
        if stat.S_ISCHR(info.st_mode) and (os.major(info.st_rdev), os.minor(info.st_rdev)) in STATELESS_DEVICES:
            continue
        if stat.S_ISREG(info.st_mode) and not flags & os.O_PATH and mount in unchanging:
            continue
        copy.check("close", int(entry))


def _unchanging_mounts(pid: int, tmpfs: list[str]) -> set[int]:
    """Mounts of the process's namespace where what a file holds no other process can change: the
    read-only ones, and its own tmpfs mounts (at `tmpfs`)."""
    unchanging = set()
    with open(f"/proc/{pid}/mountinfo") as listing:
        for line in listing:
            fields, _, tail = line.partition(" - ")
            parts, fstype = fields.split(), (tail.split() or [""])[0]
            if fstype in ("proc", "mqueue"):
                continue  # their files are the kernel's live state, read-only mount or not
            if "ro" in parts[5].split(",") or (fstype == "tmpfs" and parts[4] in tmpfs):
                unchanging.add(int(parts[0]))
    return unchanging


def _own_domain(source: tracing.Tracee) -> None:
    """A process into a Landlock domain of its own: what stays in the one it had is out of its reach
    (signals, ptrace and /proc, abstract sockets): the parent's copies, a copy's PID 1."""
    attr = source.put(bytes(16) + LANDLOCK_SCOPES.to_bytes(8, "little"))
    ruleset = source.check("landlock_create_ruleset", attr, 24, 0)
    try:
        source.check("landlock_restrict_self", ruleset, 0)
    finally:
        source.call("close", ruleset)


def _run_helper(work: Callable[[], None]) -> None:
    """Run `work` in a child of ours (it changes namespaces and credentials) and wait for it; its
    error, if it fails, is the CopyFailed's (the traceback goes to the server's log)."""
    why_r, why_w = os.pipe()
    try:
        pid = os.fork()
    except BlockingIOError:
        os.close(why_r)
        os.close(why_w)
        raise ProcessLimit() from None
    if pid == 0:
        os.close(why_r)
        try:
            work()
            os._exit(0)
        except ProcessLimit:
            os._exit(PROCESS_LIMIT_STATUS)
        except BaseException as exc:
            os.write(2, f"verl-sf: fork set-up failed: {traceback.format_exc()}".encode())
            why, refused = _why(exc)
            os.write(why_w, why.encode(errors="replace")[:2000])
            os._exit(REFUSED_STATUS if refused else 1)
    os.close(why_w)
    try:
        why = os.read(why_r, 2000).decode(errors="replace")  # at its exit, or what it wrote
    finally:
        os.close(why_r)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == PROCESS_LIMIT_STATUS:
        raise ProcessLimit()
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == REFUSED_STATUS:
        raise Refused(why)
    if status != 0:
        raise CopyFailed(f"the fork's set-up failed: {why or f'status {status:#x}'}")


def _why(exc: BaseException) -> tuple[str, bool]:
    """A set-up error as a client can act on it, and whether it is the session's to mend (409)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return ("the copy of the session's files does not fit a fork's own (tmpfs of the session's sizes): "
                "remove some first"), True
    if isinstance(exc, CopyFailed):
        return str(exc), isinstance(exc, Refused)
    return f"{type(exc).__name__}: {exc}", False


def _map_ids(source: int, pid: int, ids: str) -> None:
    """The copy keeps its ids: written from its parent's user namespace, as the kernel asks (and as
    the owner of the copy's /proc files: a helper of its own, since the next one changes uid)."""
    user = os.open(f"/proc/{source}/ns/user", os.O_RDONLY)
    if os.fstat(user).st_ino != os.stat("/proc/self/ns/user").st_ino:
        linux.check(linux.libc.setns(user, CLONE_NEWUSER), "setns(user)")
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as mapping:
            mapping.write(ids)


def _helper(blueprint: Blueprint, pid: int, groups: Groups, fifos: list[str]) -> None:
    """Into the copy's cgroups (as its uid: cgroup v1 moves only a process of the opener's uid), then
    its namespaces, where a child of ours, in its PID namespace, does the mounts."""
    cfg = blueprint.cfg
    kinds = {"user": CLONE_NEWUSER, "mnt": CLONE_NEWNS, "net": CLONE_NEWNET, "pid": CLONE_NEWPID}  # in setns order
    namespaces = {kind: os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY) for kind in kinds}
    if not cfg["single_uid"]:
        linux.check(linux.libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "PR_SET_KEEPCAPS")
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        linux.raise_permitted()
    # This helper too: the copies of the parent's files it and its child write are charged to the copy.
    for group in set(groups.values()):
        write(group, "cgroup.procs", str(pid))
        write(group, "cgroup.procs", str(os.getpid()))
    for kind, flag in kinds.items():
        linux.check(linux.libc.setns(namespaces[kind], flag), f"setns({kind})")
    _run_helper(lambda: _mounts(blueprint, fifos))
    linux.new_network()


def _mounts(blueprint: Blueprint, fifos: list[str]) -> None:
    """In the copy's namespaces: its own /proc, fresh tmpfs holding copies of the parent's files,
    /dev/shm and /dev/pts, and the pipes it will take its calls on."""
    cfg = blueprint.cfg
    os.chdir("/")
    linux.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    for target, options, keep in blueprint.mounts:
        old = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        kept = [os.open(f"{target}/{entry}", os.O_PATH | os.O_CLOEXEC) for entry in keep]
        linux.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
        new = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        _copy_tree(old, new, os.fstat(old).st_dev, set(keep))
        os.close(old)
        os.close(new)
        for entry, fd in zip(keep, kept, strict=True):
            os.mkdir(f"{target}/{entry}", 0o711)
            linux.mount(f"/proc/self/fd/{fd}".encode(), f"{target}/{entry}".encode(), None, MS_BIND | MS_REC, None)
            os.close(fd)
    linux.bind_home_alias(cfg["home_alias"], cfg["workdir"])
    linux.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, b"newinstance,ptmxmode=0666,mode=0620")
    for path in fifos:
        os.mkfifo(path, 0o600)


def _copy_tree(source: int, target: int, device: int, skip: set[str]) -> None:
    """Copy a directory's entries by descriptor, however deep (trees.walk): symlinks as symlinks, never
    followed; other mounts (and `skip`, at the top) left out; sockets and devices left out (nothing
    here could make them).  A directory takes its mode, owner and times once it is filled."""
    here = [os.open(".", trees.DIRECTORY, dir_fd=target)]  # the copy of the directory the walk is in
    depth = [0]
    linked: dict[int, int] = {}  # a file with several names: its inode -> an O_PATH of its copy

    def move(name: str) -> None:
        there = os.open(name, trees.DIRECTORY, dir_fd=here[0])
        os.close(here[0])
        here[0] = there

    def enter(directory: int, name: str) -> Optional[int]:
        if not depth[0] and name in skip:
            return None
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            if info.st_dev != device:
                return None
            inner = os.open(name, trees.DIRECTORY, dir_fd=directory)
            try:
                os.mkdir(name, 0o700, dir_fd=here[0])
                move(name)
            except OSError:
                os.close(inner)
                raise
            depth[0] += 1
            return inner
        if stat.S_ISREG(info.st_mode) and info.st_ino in linked:  # the same file again, not a copy of it
            os.link(f"/proc/self/fd/{linked[info.st_ino]}", name, dst_dir_fd=here[0], follow_symlinks=True)
            return None
        if stat.S_ISREG(info.st_mode):
            reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=directory)
            writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=here[0])
            try:
                _copy_data(reader, writer, info.st_size)
                os.chmod(writer, mode)
            finally:
                os.close(reader)
                os.close(writer)
            if info.st_nlink > 1 and len(linked) < LINKS_KEPT:
                linked[info.st_ino] = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here[0])
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=directory), name, dir_fd=here[0])
        elif stat.S_ISFIFO(info.st_mode):
            os.mkfifo(name, mode, dir_fd=here[0])
        else:
            return None
        _keep_owner_and_times(info, name, here[0])
        return None

    def leave(directory: int, name: str) -> None:
        move("..")
        depth[0] -= 1
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        os.chmod(name, stat.S_IMODE(info.st_mode), dir_fd=here[0])  # a directory we made: nothing to follow
        _keep_owner_and_times(info, name, here[0])

    try:
        trees.walk(source, enter, leave)
    finally:
        os.close(here[0])
        for handle in linked.values():
            os.close(handle)


def _keep_owner_and_times(info: os.stat_result, name: str, directory: int) -> None:
    with contextlib.suppress(OSError):  # owners not mapped here (the sandbox's root) stay ours
        os.chown(name, info.st_uid, info.st_gid, dir_fd=directory, follow_symlinks=False)
        if info.st_mode & (stat.S_ISUID | stat.S_ISGID) and not stat.S_ISLNK(info.st_mode):
            os.chmod(name, stat.S_IMODE(info.st_mode), dir_fd=directory)  # chown cleared them; one we made
    with contextlib.suppress(OSError):
        os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=directory, follow_symlinks=False)


def _copy_data(reader: int, writer: int, size: int) -> None:
    """The file's data, holes left holes (a sparse file of any size costs what it holds)."""
    os.ftruncate(writer, size)
    offset = 0
    while offset < size:
        try:
            start = os.lseek(reader, offset, os.SEEK_DATA)
        except OSError as exc:  # ENXIO: nothing but a hole from here
            if exc.errno == errno.ENXIO:
                return
            raise
        end = os.lseek(reader, start, os.SEEK_HOLE)
        os.lseek(writer, start, os.SEEK_SET)
        while start < end:
            copied = os.sendfile(writer, reader, start, end - start)
            if copied == 0:
                return
            start += copied
        offset = end
