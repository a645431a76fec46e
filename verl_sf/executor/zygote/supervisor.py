"""The zygote's own loop: requests in, one pre-forked child per run or session, replies out.

Requests arrive on fd 0 and replies leave on fd 1, a line each (see messages.py).  A child is
forked ahead of time (by the template, template.py: never by the zygote, whose heap holds earlier
jobs' data), its isolation set up, and waits for its job on a pipe: a request only pays for handing
it over.  The loop polls every job's pipes and pidfd and keeps their clocks.
"""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import select
import socket
import time
import traceback
from collections.abc import Iterable
from typing import Optional

from . import fork_request, linux, procfs, trees
from .child import Blueprint, Mount
from .job import Job, Watcher
from .messages import Head, Reply, ZygoteConfig
from .metadata import MetadataCalls, directories_of
from .python_runner import install_stdio, stdio_for_runs
from .run import Run
from .run_groups import Groups, RunGroups
from .seccomp import compiled_filter
from .session import SessionJob, refuse_call
from .template import Template, TemplateFailed
from .warmup import preload
from .wire import READ_CHUNK, Lines, dumps, loads, readable, write_all

Ready = tuple[int, int, int, int, int, Groups]  # pid, stdout, stderr, fd 3 and job pipe ends, cgroups
Ends = tuple[int, int, int, int, Groups]  # a child ordered from the template: its Ready but the pid
MAX_FREE_NETWORKS = 256  # network namespaces kept for reuse
ENDED_KEPT = 4096  # ended sessions whose reason a late call is still told
# Plain children kept ready: two, so that one forked as the last run ended has finished setting up
# by the time the next request of a client waiting on that reply comes (its set-up takes longer).
READY_DEPTH = {False: 2, True: 1}
# While a run waits for its answer, one: a fork then would hold the zygote up as the run ends.
READY_DEPTH_BUSY = {False: 1, True: 1}


class Zygote:
    def __init__(self, config: ZygoteConfig):
        self.cfg = config
        self.isolated = config["isolated"]
        with open("/proc/self/comm", "rb") as comm:
            name = comm.read().strip()
        # A session holds seven descriptors here (pipes, pidfds, its network): as many as the hard
        # limit allows (runs set their own limit).
        resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
        # Protocol fds move out of 0/1 so children can take those numbers for their stdio.
        self.req_fd = os.dup(0)
        self.rep_fd = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        os.set_blocking(self.req_fd, False)
        os.environ.clear()  # children inherit the environment: set once here, not in every run
        os.environ.update(config["env"])
        seccomp = compiled_filter(config)
        owner = 0 if config["single_uid"] else config["uid"]
        mounts = [Mount(target, _tmpfs_options(config["sizes"][target], target == config["tmpdir"], owner),
                        config["keep"].get(target, []))
                  for target in dict.fromkeys((config["workdir"], config["tmpdir"], config["datadir"]))
                  if target in config["sizes"]]
        if self.isolated:  # POSIX shared memory and semaphores (multiprocessing's locks) live here: the run's own too
            mounts.append(Mount("/dev/shm", _tmpfs_options(config["sizes"][config["tmpdir"]], True, owner), []))
        os.makedirs(config["workdir"], exist_ok=True)
        if not self.isolated:  # what the runs of this sandbox's last zygote left, had it died (killed, crashed)
            for entry in os.listdir(config["workdir"]):
                if entry.startswith("run-"):
                    _remove_run_directory(f"{config['workdir']}/{entry}")
        if self.isolated:
            linux.shrink_capabilities()
        else:
            linux.become_subreaper()  # a run's orphans come back here when its PID 1 is gone
        install_stdio(stdio_for_runs())  # before the preload, whose gc.freeze() then covers it
        reseed = preload(config["preload"], config["ipython"])
        self.blueprint = Blueprint(config, seccomp, mounts, name, os.path.realpath(config["workdir"]), reseed)
        self.groups = RunGroups(config)
        if self.isolated:
            linux.read_only_tree()  # once, after the warm-up's writes: every run's mount namespace copies it
        # A run's network namespace outlives it here, empty (its sockets died with its processes, and
        # TIME_WAIT is off in it), for a later run: making one per run costs more than the run itself.
        self.free_networks: list[int] = []
        self.ready_networks: dict[int, int] = {}  # ready child's pid -> the network namespace handed to it
        self.networks: dict[int, int] = {}  # job pid -> its network namespace, to free when the job is gone
        self.own_namespaces = {kind: os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("net",)}
        self.sequence = 0
        # Pre-forked children waiting for their job: a plain one, and one with a root helper (root.py)
        # once a session asked for root.
        self.ready: dict[bool, list[Ready]] = {False: [], True: []}
        self.rooted_wanted = False
        self.runs: dict[int, Run] = {}  # request id -> run
        self.sessions: dict[int, SessionJob] = {}  # open request id -> session
        self.ended: collections.OrderedDict[int, str] = collections.OrderedDict()  # recent sessions' end reasons
        self.reaping: dict[int, Job] = {}  # pidfd -> job whose answer is sent and whose PID 1 is still to collect
        self.fd_owner: dict[int, Watcher] = {}  # fd -> its job (or fork in progress), for the poll loop
        self.writers: dict[int, Job] = {}  # a job's socket -> that job, while it has something left to send
        self.requests = Lines()
        # Last, once the zygote is all set up and before any request: it forks every child.
        self.template = Template(self.blueprint, [self.req_fd, self.rep_fd])
        # epoll, not poll: a wait costs what is ready, not every fd of every live session (a third of
        # the zygote's CPU at 64 live sessions).  Made after the template's fork, which never holds it.
        self.poller = select.epoll()
        self.poller.register(self.req_fd, select.EPOLLIN)
        self.poller.register(self.template.socket.fileno(), select.EPOLLIN)
        if self.template.metadata >= 0:
            calls = MetadataCalls(self.template.metadata, lambda: directories_of(self.jobs()))
            self.watch(calls, (self.template.metadata,))
        self.ordered: collections.deque[tuple[bool, Ends, int]] = collections.deque()  # rooted, ends, network
        # Jobs that came when no child was ready, with the time their client stops waiting: the loop
        # never waits for the template (under a fork bomb its fork can take minutes), so kills go on.
        self.waiting: collections.deque[tuple[Job, float]] = collections.deque()
        self.order_failed = False  # the template's last fork failed: no more are ordered until a request comes

    def jobs(self) -> list[Job]:
        return [*self.runs.values(), *self.sessions.values()]

    # ---- main loop -----------------------------------------------------------------------------
    def serve(self) -> None:
        self.prepare()
        self.reply({"kind": "ready", "id": 0, "pid": os.getpid()})
        while True:
            timeout = self._next_timer()
            events = self.poller.poll(-1 if timeout is None else max(0.0, timeout) + 0.001)
            for fd, mask in events:
                if fd in self.writers and mask & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                    self.writers[fd].send_more(self)
                    if fd not in self.fd_owner:
                        continue
                if fd == self.req_fd:
                    if not self._read_requests():
                        self._shutdown()
                        return
                    continue
                if fd == self.template.socket.fileno():
                    if readable(fd):  # else a job's start took the answer since the poll
                        self._take_forked()
                    continue
                if not readable(fd):
                    continue  # drained, closed or reused since the poll: a read now would wait
                job = self.fd_owner.get(fd)
                if job is not None:
                    job.on_event(self, fd)
                elif fd in self.reaping:
                    self._reap(fd)
            now = time.monotonic()
            for job in self.jobs():
                job.on_time(self, now)
            self._expire_waiting(now)
            self.prepare()

    def _next_timer(self) -> Optional[float]:
        deadlines = [d for d in (job.next_timer() for job in self.jobs()) if d is not None]
        deadlines += [until for _, until in self.waiting]
        return min(deadlines) - time.monotonic() if deadlines else None

    def _read_requests(self) -> bool:
        """Take every complete request line available; False once the server is gone."""
        while True:
            try:
                chunk = os.read(self.req_fd, READ_CHUNK)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            for line in self.requests.feed(chunk):
                head_text, _, body = line.partition(b"\t")
                head = loads(head_text.decode())
                try:
                    self._dispatch(head, body)
                except Exception as exc:  # a bug here must not take the sandbox down silently
                    self.reply({"kind": "failed", "id": head.get("id", -1), "error": f"verl-sf zygote error: {exc!r}\n"
                                                                   f"{traceback.format_exc()}"})
            if len(chunk) < READ_CHUNK:
                return True

    def _dispatch(self, head: Head, body: bytes) -> None:
        self.order_failed = False
        if head["op"] == "run":
            self._start(Run(self, head, body))
        elif head["op"] == "open":
            self._start(SessionJob(self, head, body))
        elif head["op"] == "call":
            session = self.sessions.get(head["session"])
            if session is None or not session.alive:
                reason = (self.ended.get(head["session"], "the sandbox holds no such session (its zygote restarted)")
                          if session is None else session.failure or session.end_reason or "its interpreter exited")
                refuse_call(self, head, reason)
            else:
                session.begin_call(self, head, body)
        elif head["op"] == "fork":
            fork_request.fork_session(self, head)
        elif head["op"] == "cancel":
            run = self.runs.get(head["id"])
            if run is not None:
                run.kill(self, "cancelled")
            self._unqueue(head["id"])
        elif head["op"] == "close":
            closed = self.sessions.get(head["session"])
            if closed is not None:
                closed.kill(self, "closed")
            self._unqueue(head["session"])
            self.reply({"kind": "closed", "id": head["id"]})  # every process of it killed: none runs code again
        elif head["op"] == "interrupt":
            interrupted = self.sessions.get(head["session"])
            if interrupted is not None:
                interrupted.interrupt(time.monotonic())

    def reply(self, reply: Reply) -> None:
        with contextlib.suppress(BrokenPipeError):  # the server is gone: nobody to tell (it shuts us down)
            write_all(self.rep_fd, dumps(reply) + b"\n")

    def _shutdown(self) -> None:
        for job in self.jobs():
            job.kill(self, "the server shut down")
        if not self.isolated:
            self.reap_orphans()  # no PID namespace ends what runs answered already left dying here
        for ready in (ready for kind in self.ready.values() for ready in kind):
            for fd in ready[1:5]:
                os.close(fd)
        for _, ends, _ in self.ordered:
            for fd in ends[:4]:
                os.close(fd)
        self.template.close()

    # ---- children ------------------------------------------------------------------------------
    def _start(self, job: Job) -> None:
        """Start a job on a ready child, or queue it until the template forks one."""
        self.rooted_wanted |= job.rooted
        self.waiting.append((job, time.monotonic() + job.limits["hard_timeout"]))
        self._start_waiting()
        self.prepare()

    def _start_waiting(self) -> None:
        """Each queued job whose kind of child is ready starts, oldest first."""
        for entry in list(self.waiting):
            job = entry[0]
            if not self.ready[job.rooted]:
                continue
            self.waiting.remove(entry)
            try:
                job.start(self)
            except Exception as exc:  # as _read_requests answers a request it could not take
                self.reply({"kind": "failed", "id": job.id, "error": f"verl-sf zygote error: {exc!r}\n"
                                                                    f"{traceback.format_exc()}"})

    def _expire_waiting(self, now: float) -> None:
        for entry in [entry for entry in self.waiting if entry[1] <= now]:
            self.waiting.remove(entry)
            self._fail_waiting(entry[0], "no child could be forked for it before its client's deadline (the "
                                         "sandbox is overloaded, e.g. by a fork bomb)")

    def _fail_waiting(self, job: Job, why: str) -> None:
        self.reply({"kind": "failed", "id": job.id, "error": f"verl-sf: {why}"})

    def _unqueue(self, job_id: int) -> None:
        for entry in [entry for entry in self.waiting if entry[0].id == job_id]:
            self.waiting.remove(entry)

    def prepare(self) -> None:
        """Fork the next children ahead of time, namespaces and all, so a request only pays for
        handing one its job.  Each waits on its job socket; the zygote closing that ends it.  The
        second plain one is forked once no run waits for its answer (the zygote's fork is its own CPU)."""
        if self.order_failed:
            return
        depth = READY_DEPTH_BUSY if self.runs else READY_DEPTH
        for rooted in (False, True) if self.rooted_wanted else (False,):
            wanted = depth[rooted] + sum(1 for job, _ in self.waiting if job.rooted == rooted)
            while len(self.ready[rooted]) + self._ordered(rooted) < wanted:
                self._order_child(rooted)

    def _ordered(self, rooted: bool) -> int:
        return sum(1 for kind, _, _ in self.ordered if kind == rooted)

    def _order_child(self, rooted: bool) -> None:
        """Ask the template for the next child: it gets one end of each of its pipes, we keep the other."""
        self.sequence += 1
        groups = self.groups.make(self.sequence)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        meta_r, meta_w = os.pipe()
        # A socket, not a pipe: a fast-path run's child sends its exit listener back on it (exits.py).
        job_r, job_w = (end.detach() for end in socket.socketpair())
        network = self.free_networks.pop() if self.isolated and self.free_networks else -1
        theirs = [job_r, out_w, err_w, meta_w]
        self.template.order({"sequence": self.sequence, "groups": groups, "rooted": rooted, "network": network >= 0},
                            theirs + ([network] if network >= 0 else []))
        for fd in theirs:
            os.close(fd)
        self.ordered.append((rooted, (out_r, err_r, meta_r, job_w, groups), network))

    def _take_forked(self) -> None:
        """The template's answer to the oldest order: the child, now ready, and a queued job started
        on it.  If it could not be forked, the oldest job waiting for that kind fails with why; if
        the template is gone, so is the zygote (the server starts another)."""
        try:
            pid = self.template.answer()
        except TemplateFailed as exc:
            if not self.ordered or not exc.errno:
                raise
            rooted, ends, network = self.ordered.popleft()
            for fd in ends[:4]:
                os.close(fd)
            self.groups.release(ends[4], True)
            if network >= 0:
                self.free_networks.append(network)
            self.order_failed = True
            for entry in self.waiting:
                if entry[0].rooted == rooted:
                    self.waiting.remove(entry)
                    self._fail_waiting(entry[0], str(exc))
                    break
            return
        rooted, ends, network = self.ordered.popleft()
        self.ready[rooted].append((pid, *ends))
        self.ready_networks[pid] = network
        self._start_waiting()

    def take_ready(self, rooted: bool = False) -> Ready:
        """A pre-forked child for a job (there is one: _start saw to it); `rooted`: one with a root
        helper (sessions that asked for root)."""
        self.rooted_wanted |= rooted
        ready = self.ready[rooted].pop(0)  # the oldest: the likeliest to have finished its set-up
        pid = ready[0]
        network = self.ready_networks.pop(pid)
        if self.isolated:
            self.networks[pid] = network if network >= 0 else self._namespace(pid, "net")
        return ready

    def _namespace(self, pid: int, kind: str) -> int:
        """A descriptor of a namespace the ready child made for itself, or -1 if it has not made it yet."""
        try:
            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
        if os.fstat(fd).st_ino == self.own_namespaces[kind]:
            os.close(fd)
            return -1
        return fd

    def watch(self, job: Watcher, fds: Iterable[int]) -> None:
        for fd in fds:
            self.fd_owner[fd] = job
            if fd in self.writers:
                self.poller.modify(fd, select.EPOLLIN | select.EPOLLOUT)
            else:
                self.poller.register(fd, select.EPOLLIN)

    def unwatch(self, fd: int) -> None:
        self.fd_owner.pop(fd, None)
        with contextlib.suppress(OSError):  # not watched
            if fd in self.writers:
                self.poller.modify(fd, select.EPOLLOUT)
            else:
                self.poller.unregister(fd)

    def want_writable(self, job: Job, fd: int, wanted: bool) -> None:
        """Told when `fd` takes more, while `job` has something left to send on it."""
        if wanted == (fd in self.writers):
            return
        if wanted:
            self.writers[fd] = job
        else:
            del self.writers[fd]
        reading = select.EPOLLIN if fd in self.fd_owner else 0
        if reading:
            self.poller.modify(fd, reading | (select.EPOLLOUT if wanted else 0))
        elif wanted:
            self.poller.register(fd, select.EPOLLOUT)
        else:
            self.poller.unregister(fd)

    def retire(self, job: Job) -> None:
        """The answer is out: forget the job, and collect its PID 1 once it is gone."""
        self.runs.pop(job.id, None)
        if self.sessions.pop(job.id, None) is not None:
            # A call may still be on its way to it: its answer says why the session ended.
            self.ended[job.id] = job.failure or job.end_reason or "its interpreter exited"
            while len(self.ended) > ENDED_KEPT:
                self.ended.popitem(last=False)
        self.unwatch(job.pidfd)
        for fd in list(job.open_fds):
            self.unwatch(fd)
            os.close(fd)
        job.open_fds.clear()
        job.close_job_socket(self)
        if job.listener >= 0:
            self.unwatch(job.listener)
            os.close(job.listener)
            job.listener = -1
        if job.collected:
            self._clean_up(job)
            return
        self.reaping[job.pidfd] = job
        self.poller.register(job.pidfd, select.EPOLLIN)

    def reap_orphans(self) -> None:
        """Without PID namespaces: every child of ours that is no job's PID 1 nor the ready child was
        orphaned by a job that has ended (a job's PID 1 is a subreaper while it lives): kill it and
        all below it, and collect it, before the job's reply leaves."""
        for _ in range(64):
            known = {job.pid for job in (*self.jobs(), *self.reaping.values())}
            known.update(ready[0] for kind in self.ready.values() for ready in kind)
            known.add(self.template.pid)
            strays = [pid for pid in procfs.children(os.getpid()) if pid not in known]
            if strays and self.ordered:  # one may be a child the template forked and has not told us of yet
                self._take_forked()
                continue
            if not strays:
                return
            for pid in strays:
                procfs.kill_all(pid)
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def _reap(self, pidfd: int) -> None:
        job = self.reaping.pop(pidfd)
        self.unwatch(pidfd)
        linux.kill(job.pid, self.isolated)
        if not job.adopted:
            os.waitpid(job.pid, 0)
        if not self.isolated:
            self.reap_orphans()  # what a run answered at its exit left here as it died (job.end_at_exit)
        self._clean_up(job)

    def _clean_up(self, job: Job) -> None:
        """Once PID 1 is collected the kernel has ended every process of the job: its cgroups
        are empty and go back to the pool (the limits are rewritten by the next job)."""
        os.close(job.pidfd)
        job.close_probe()
        # A fork stays a zombie of its parent's until that one waits: its cgroup is not reused.
        self.groups.release(job.groups, job.memory_exceeded or bool(job.failure) or job.adopted)
        network = self.networks.pop(job.pid, -1)
        if network >= 0:
            if len(self.free_networks) < MAX_FREE_NETWORKS and not job.failure:
                self.free_networks.append(network)
            else:
                os.close(network)
        if not self.isolated:
            _remove_run_directory(f"{self.cfg['workdir']}/run-{job.pid}")


def _remove_run_directory(directory: str) -> None:
    try:
        trees.remove_tree(directory)
    except OSError as exc:  # left behind, and said so; the runs beside it go on
        os.write(2, f"verl-sf: {directory} could not be removed: {exc}\n".encode())


def _tmpfs_options(size: int, sticky: bool, owner: int) -> bytes:
    """As many entries as the mount has pages (no more files with content could fit): without a
    memory cgroup nothing else bounds a run's empty files, each a kilobyte of the kernel's own memory
    (500,000 of them took 500 MB against a 128 MB cap)."""
    mode = "1777" if sticky else "0755"
    return f"size={size},nr_inodes={max(size // 4096, 1024)},mode={mode},uid={owner},gid={owner}".encode()
