"""The executor: admission, CPU slots, warm interpreters per flavor, and live sessions.

It turns a Sandbox Fusion request into one zygote job (jobs.py: an optional compile stage, then
the run) and the reply into the Sandbox Fusion response (responses.py).  Admission is a cap on
runs in flight (beyond it: `Overloaded`, a 503); an admitted run waits only for a CPU slot, which
runs hold for their first slice at most (see slots.py), so the wait is short whatever the other
runs do.  `run_timeout` counts from the run's start, not counting time it waited for a CPU, and
every reply leaves before the client's deadline (run_timeout + compile_timeout + 10 s, verl's).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from typing import Optional, Union

from verl_sf.errors import ForkFailed, ForkUnavailable, InvalidRequest, Overloaded, SessionBusy, SessionGone
from verl_sf.executor import jobs, rungs
from verl_sf.executor.cgroups import CgroupManager, SandboxCgroup
from verl_sf.executor.config import CELLS, ExecutorConfig
from verl_sf.executor.gpu_slots import GpuLease, GpuSlots, NoGpuFree
from verl_sf.executor.gpus import gpu_views, host_gpus, parse_gpu_choice
from verl_sf.executor.languages import SPECS, SourceRejected, Toolchains, detect_toolchains, etc_paths
from verl_sf.executor.responses import ResponseContext, jupyter_response, note_session_end, run_response
from verl_sf.executor.sandbox import SandboxLauncher
from verl_sf.executor.session_table import SessionRecord, SessionTable
from verl_sf.executor.slots import CpuSlots
from verl_sf.executor.snapshot_table import Snapshot, SnapshotTable
from verl_sf.executor.status import ExecutorStats, ExecutorStatus
from verl_sf.executor.zygote.messages import Reply, SessionCallBody, SessionCallHead
from verl_sf.executor.zygote_process import SandboxCrashed, ZygoteProcess, closed_now, encode_body
from verl_sf.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
    SessionCreateRequest,
    SessionForkRequest,
    SessionForkResponse,
    SessionInfo,
    SnapshotInfo,
)

log = logging.getLogger(__name__)
STDLIB, FULL = "stdlib", "full"  # interpreter flavors beside one per preloaded library

__all__ = ["Executor", "ExecutorStats", "ExecutorStatus", "ForkFailed", "InvalidRequest", "Overloaded"]
# A fork's first call, when the request asks its random generators reseeded (they otherwise
# draw what the parent would have drawn next, as after fork(2)).
RESEED = {"python": "import random as _r, sys as _s\n_r.seed()\nif 'numpy' in _s.modules:\n"
                    "    _s.modules['numpy'].random.seed()\ndel _r, _s\n",
          "bash": "RANDOM=$SRANDOM"}
def gpu_flavor(index: int) -> str:
    """The zygote group of GPU `index`'s sandbox."""
    return f"gpu{index}"


# Run in a python session just before it is forked: the collector then leaves the objects made so
# far alone, so the copies do not write (and so copy) every page of them on their first collection.
FREEZE = "import gc as _gc\n_gc.freeze()\ndel _gc\n"



class Executor:
    def __init__(self, config: Optional[ExecutorConfig] = None, extra_etc: tuple[str, ...] = ()):
        self.config = config or ExecutorConfig()
        self.stats = ExecutorStats()
        self.toolchains: Optional[Toolchains] = None
        self.cgroups: Optional[CgroupManager] = None
        self.slots = CpuSlots(self.config.slots, self.config.cpu_slice_s)
        self.gpu_slots: Optional[GpuSlots] = None  # with --gpus: one slot per GPU (runs_per_gpu)
        self._launcher: Optional[SandboxLauncher] = None
        self._extra_etc = extra_etc
        self._gpu_launchers: list[SandboxLauncher] = []
        self._zygotes: dict[str, list[ZygoteProcess]] = {}
        self._heavy_names: Optional[re.Pattern[str]] = None
        self._table = SessionTable()
        self._snapshots = SnapshotTable(self._table.boot_tag)
        self._reaper: Optional[asyncio.Task[None]] = None
        self.rung: rungs.Rung = rungs.Unisolated("not started")  # chosen at start
        self._fork_refusal = "the executor has not started"  # why sessions cannot be forked ("": they can)

    @property
    def sessions(self) -> dict[str, SessionRecord]:
        """Live sessions by id."""
        return self._table.live

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.rung = await asyncio.to_thread(rungs.choose, self.config.isolation)
        self._fork_refusal = self._why_no_forks()
        warning = self.rung.warning()
        if warning:
            log.warning(warning)
        else:
            log.info("verl-sf: isolation %s: %s", self.rung.name, self.rung.reason)
        if self.rung.confined:
            self.cgroups = CgroupManager(f"verl-sf-{os.getpid()}-{id(self):x}", self.config.runs_memory_mb << 20)
            if not self.cgroups.available:
                log.warning("verl-sf: without cgroups, runs are capped by rlimits (RLIMIT_DATA, RLIMIT_NPROC) and a "
                            "memory watchdog that kills a run past its cap: %s", self.cgroups.reason)
        present = host_gpus()
        chosen = parse_gpu_choice(self.config.gpus, present)
        self.toolchains = await asyncio.to_thread(detect_toolchains, self.config.python, self.config.preload,
                                                  self.config.runtime_dir)
        if not chosen:
            self.toolchains.refuse_gpu_languages(
                f"needs a GPU given to the server (`verl-sf serve --gpus all`; this host has {len(present)})"
                if present else "needs an NVIDIA GPU and the CUDA toolkit: this host has no GPU (no /dev/nvidiactl "
                                "with a /dev/nvidiaN beside it)")
        extra_etc = tuple(etc_paths(self.toolchains.available_languages())) + self._extra_etc
        self._launcher = SandboxLauncher(self.config, self.toolchains, extra_etc, self.rung)
        if chosen:
            self.gpu_slots = GpuSlots(chosen, self.config.runs_per_gpu)
            for view in await asyncio.to_thread(gpu_views, chosen):
                if view.missing_nodes:
                    log.warning("verl-sf: GPU %d: %s missing, so CUDA runs will fail; load the driver's modules "
                                "first (`nvidia-modprobe -u -c=0`, or any CUDA program run once as root)",
                                view.index, ", ".join(view.missing_nodes))
                # A sandbox per GPU: it holds that GPU's device node and no other GPU's.
                launcher = SandboxLauncher(self.config, self.toolchains, extra_etc, self.rung, gpu=view)
                self._gpu_launchers.append(launcher)
                self._zygotes[gpu_flavor(view.index)] = [self._zygote(STDLIB, 0, launcher, gpu_flavor(view.index))]
        heavy = self._preloaded()
        if self.config.fast_path and heavy:
            self._heavy_names = re.compile(r"\b(" + "|".join(map(re.escape, heavy)) + r")\b")
        for flavor in [STDLIB, *heavy, *([FULL] if len(heavy) > 1 else [])]:
            for twin in (flavor, flavor + CELLS):
                self._zygotes[twin] = [self._zygote(twin, i) for i in range(self.config.sandboxes)]
        await asyncio.gather(*(z.ensure_started() for flavor, group in self._zygotes.items() for z in group
                               if flavor == STDLIB or flavor.startswith("gpu")))
        self._reaper = asyncio.create_task(self._expire_sessions())
        missing = sorted(self.toolchains.missing)
        if missing:
            log.info("verl-sf: languages not available here: %s (`verl-sf languages list` says how to add them)",
                     ", ".join(missing))

    def _zygote(self, flavor: str, index: int, launcher: Optional[SandboxLauncher] = None,
                group: str = "") -> ZygoteProcess:
        launcher = launcher or self._launcher
        assert launcher is not None
        name = f"{group or flavor}-{index}"
        cgroup: Optional[SandboxCgroup] = self.cgroups.sandbox(name) if self.cgroups else None
        if cgroup is not None:
            cgroup.delegate(launcher.host_uids()[0])
        return ZygoteProcess(name, flavor, launcher, cgroup, self._session_died)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for session in list(self.sessions.values()):
            self._table.forget(session, "the server shut down")
        zygotes = [z for group in self._zygotes.values() for z in group]
        await asyncio.gather(*(z.stop() for z in zygotes), return_exceptions=True)
        for zygote in zygotes:
            if zygote.cgroup:
                zygote.cgroup.remove()
        if self.cgroups:
            self.cgroups.remove()
        for launcher in [*([self._launcher] if self._launcher else []), *self._gpu_launchers]:
            launcher.close()
        self._gpu_launchers = []
        self._zygotes = {}

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- introspection ---------------------------------------------------------------------
    @property
    def isolation(self) -> str:
        """The name of the rung runs are isolated with (rungs.py); `rung.reason` says why it was chosen."""
        return self.rung.name

    @property
    def offers_root(self) -> bool:
        """Whether a session's commands can run as uid 0 of a user namespace of their own: only
        where the sandbox has user namespaces (zygote/root.py)."""
        return self.rung.offers_root

    def status(self) -> ExecutorStatus:
        """A snapshot of what the executor holds and how it isolates (status.py)."""
        config, toolchains, gpu_slots = self.config, self.toolchains, self.gpu_slots
        running = {flavor: sum(1 for z in group if z.process is not None and z.process.returncode is None)
                   for flavor, group in self._zygotes.items()}  # heavy flavors start on first use
        gpus: dict[str, object] = {"gpus": []}
        if gpu_slots is not None:
            gpus = {"gpus": gpu_slots.indices, "runs_per_gpu": gpu_slots.per_gpu,
                    "free_slots": {str(i): gpu_slots.free[i] for i in gpu_slots.indices}, "waiting": gpu_slots.waiting}
        cgroups = "off" if self.cgroups is None else "on" if self.cgroups.available else self.cgroups.reason
        limits = self.rung.limits(self.cgroups is not None and self.cgroups.available)
        if self.rung.confined:
            assert self._launcher is not None
            limits.update(self._launcher.uid_status())
        return ExecutorStatus(
            faults={z.name: z.fault for group in self._zygotes.values() for z in group if z.fault},
            isolation=self.isolation, cgroups=cgroups, fast_path=config.fast_path, preloaded=self._preloaded(),
            warm_interpreters={flavor: count for flavor, count in running.items() if count},
            languages=toolchains.available_languages() if toolchains else [],
            missing_languages=toolchains.missing_summary() if toolchains else {}, limits=limits,
            slots=config.slots, sandboxes=config.sandboxes, in_flight=self.stats.in_flight, queued=self.slots.waiting,
            gpus=gpus, max_in_flight=config.max_in_flight, sessions=len(self.sessions),
            max_sessions=config.max_sessions, snapshots=len(self._snapshots.live), max_snapshots=config.max_snapshots,
            counts=dataclasses.replace(self.stats))

    def _preloaded(self) -> list[str]:
        """The heavy libraries served from warm interpreters (those the runtime has)."""
        if self.toolchains is None:
            return []
        return [name for name in self.config.preload if name in self.toolchains.importable]

    # ---- admission -------------------------------------------------------------------------
    def _admit(self, memory_mb: int, caller: Optional[SessionRecord] = None) -> None:
        if self.stats.in_flight >= self.config.max_in_flight:
            self.stats.rejected += 1
            raise Overloaded(f"{self.stats.in_flight} runs in flight (max_in_flight={self.config.max_in_flight})")
        self._make_room(memory_mb, caller)
        self.stats.in_flight += 1

    def _make_room(self, memory_mb: int, caller: Optional[SessionRecord]) -> None:
        """Idle sessions' files count against the cap over all runs and sessions but belong to no
        running process, so the kernel would kill a new run for them: when the cap is near, the
        longest-idle sessions are evicted first (a run is assumed to need at most a quarter of the cap)."""
        if not self.sessions or self.cgroups is None or not self.cgroups.available:
            return
        used = self.cgroups.memory_usage()
        cap = self.config.runs_memory_mb << 20
        need = min(memory_mb << 20, cap // 4)
        if used is None or used + need <= cap:
            return
        for session in self._table.idle():
            if session is caller:
                continue
            held = self._session_memory(session) or 0
            self._end(session, f"evicted: its memory ({held >> 20} MB) was needed by a new run under the server's "
                               f"cap of {self.config.runs_memory_mb} MB for all runs and sessions")
            used -= held
            if used + need <= cap:
                return

    async def _pick(self, flavor: str) -> ZygoteProcess:
        zygote = min(self._zygotes[flavor], key=lambda z: z.load)
        await zygote.ensure_started()
        return zygote

    def _flavor_for(self, code: str) -> str:
        """The smallest warm interpreter that has what the code names: stdlib, the one library's, or full.
        Only a speed choice: code that imports a library anyway still works from any interpreter."""
        if self._heavy_names is None:
            return STDLIB
        named = set(self._heavy_names.findall(code))
        if not named:
            return STDLIB
        return named.pop() if len(named) == 1 else FULL

    def _memory_mb(self, requested: int) -> int:
        return self.config.default_memory_mb if requested == -1 else requested

    def _context(self, memory_mb: int, queue_wait: float = 0.0, session_id: Optional[str] = None) -> ResponseContext:
        return ResponseContext(self.config.pod_name, self.config.runs_memory_mb, memory_mb, queue_wait, session_id)

    async def _run(self, flavor: str, job: jobs.Job, arrived: float, gpu: bool = False) -> tuple[Reply, float]:
        """Admit, wait for a GPU slot (`gpu`: held until the reply, which comes once the run's
        processes, and so its CUDA context, are gone) and a CPU slot, run, and give the slots back;
        (reply, time spent queued).  NoGpuFree when no GPU slot came free within the run's timeout."""
        self._admit(job.body["memory"] >> 20)
        gpu_lease: Optional[GpuLease] = None
        try:
            if gpu:
                assert self.gpu_slots is not None
                gpu_lease = await self.gpu_slots.acquire(job.head["limits"]["timeout"])
                flavor = gpu_flavor(gpu_lease.index)
            lease = await self.slots.acquire()
            try:
                zygote = await self._pick(flavor)
                queue_wait = time.monotonic() - arrived
                jobs.hand_over(job.head["limits"], queue_wait)
                reply = await zygote.request(job.head, encode_body(job.body))
            finally:
                lease.release()
        except asyncio.CancelledError:  # its client went away, whether it was queued or running
            self.stats.cancelled += 1
            raise
        finally:
            self.stats.in_flight -= 1
            if gpu_lease is not None:
                gpu_lease.release()
        return reply, queue_wait

    def _count(self, response: Union[RunCodeResponse, RunJupyterResponse]) -> None:
        results = [getattr(response, "run_result", None), getattr(response, "driver", None)]
        self.stats.cpu_starved += sum(1 for result in results if result is not None and result.cpu_starved)

    # ---- requests --------------------------------------------------------------------------
    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert self.toolchains is not None, "Executor.start() first"
        if request.session_id is not None:
            return await self._session_run_code(request)
        arrived = time.monotonic()
        spec = SPECS[request.language]
        if request.language in self.toolchains.missing:
            return RunCodeResponse(status=RunStatus.SandboxError,
                                   message=self.toolchains.missing_message(request.language),
                                   executor_pod_name=self.config.pod_name)
        try:
            source = spec.prepare_source(request.code)
        except SourceRejected as exc:
            rejected = CommandRunResult(status=CommandRunStatus.Finished, return_code=1, stdout="", stderr=str(exc))
            return RunCodeResponse(status=RunStatus.Failed, message="compilation failed", compile_result=rejected,
                                   executor_pod_name=self.config.pod_name)
        memory_mb = self._memory_mb(request.memory_limit_MB)
        fast = request.language == "python" and self.config.fast_path
        job = jobs.run_job(request, source, self.toolchains.argv(spec.run, source.params),
                           self.toolchains.argv(spec.compile, source.params) if spec.compile else None,
                           self.config, memory_mb, fast)
        try:
            reply, queue_wait = await self._run(self._flavor_for(request.code) if fast else STDLIB, job, arrived,
                                                gpu=spec.gpu)
        except SandboxCrashed as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=f"sandbox failed: {exc}",
                                   run_result=CommandRunResult(status=CommandRunStatus.Error),
                                   executor_pod_name=self.config.pod_name)
        except NoGpuFree as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=str(exc),
                                   executor_pod_name=self.config.pod_name)
        response = run_response(reply, bool(spec.compile), self._context(memory_mb, queue_wait))
        self._count(response)
        return response

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        assert self.toolchains is not None, "Executor.start() first"
        if request.session_id is not None:
            return await self._session_run_jupyter(request)
        arrived = time.monotonic()
        memory_mb = self.config.default_memory_mb
        job = jobs.jupyter_job(request, self.config, memory_mb)
        try:
            reply, queue_wait = await self._run(self._flavor_for("\n".join(request.cells)) + CELLS, job, arrived)
        except SandboxCrashed as exc:
            return RunJupyterResponse(status=RunStatus.SandboxError, message=f"sandbox failed: {exc}",
                                      executor_pod_name=self.config.pod_name)
        response = jupyter_response(reply, len(request.cells), request.total_timeout,
                                    self._context(memory_mb, queue_wait))
        self._count(response)
        return response

    # ---- sessions --------------------------------------------------------------------------
    async def create_session(self, request: SessionCreateRequest, cells: bool = False,
                             rooted: bool = False) -> SessionInfo:
        """`cells`: the session will mostly run cells (an E2B sandbox): it is forked from a zygote
        whose IPython shell is built already.  `rooted`: its commands may run as root, where the rung
        offers it (`offers_root`)."""
        assert self.toolchains is not None, "Executor.start() first"
        if request.from_snapshot is not None:
            return await self._start_from(request)
        if request.language == "bash" and "bash" in self.toolchains.missing:
            raise InvalidRequest("language", self.toolchains.missing_message("bash"))
        if len(self._table) + self._table.opening >= self.config.max_sessions:
            idle = self._table.idle()  # a session in a call is not idle
            if not idle:
                self.stats.rejected += 1
                raise Overloaded(f"{len(self._table)} live sessions (max_sessions), all running a call")
            self._end(idle[0], f"evicted: the server's cap of {self.config.max_sessions} live sessions was reached "
                               f"and it was the longest idle")
        memory_mb = self._memory_mb(request.memory_limit_MB)
        zygote = await self._pick(STDLIB + CELLS if cells else STDLIB)
        head, body = jobs.session_open(request.language, request.files, self.config, memory_mb,
                                       rooted and self.offers_root)
        session = SessionRecord(id=self._table.new_id(), language=request.language, zygote=zygote, open_id=head["id"],
                          memory_mb=memory_mb, idle_ttl_s=request.idle_ttl_s or self.config.session_idle_ttl_s)
        opening = asyncio.ensure_future(zygote.open_session(head, body))
        self._table.opening += 1
        try:
            reply = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # Its client left: the session is opened all the same and closed at once, never left unrecorded.
            opening.add_done_callback(lambda _: zygote.close_session(head["id"]))
            raise
        finally:
            self._table.opening -= 1
        if not reply.get("session_alive"):
            why = reply.get("stderr") or reply.get("session_end") or reply.get("error")
            raise InvalidRequest("files", f"the session could not start: {why}")
        session.group = reply.get("group")
        self._table.add(session)
        self.stats.sessions_created += 1
        return self.session_info(session.id)

    def session_info(self, session_id: str) -> SessionInfo:
        session = self._table.get(session_id)
        return SessionInfo(session_id=session.id, language=session.language, alive=True,
                           created_at=session.created_at, idle_since=session.idle_since, idle_ttl_s=session.idle_ttl_s,
                           calls=session.calls, memory_bytes=self._session_memory(session),
                           memory_limit_MB=session.memory_mb, executor_pod_name=self.config.pod_name)

    def _session_memory(self, session: SessionRecord) -> Optional[int]:
        cgroup = session.zygote.cgroup
        if cgroup is None or session.group is None or "memory" not in cgroup.dirs:
            return None
        name = "memory.current" if cgroup.v2 else "memory.usage_in_bytes"
        try:
            with open(os.path.join(cgroup.dirs["memory"], session.group, name)) as fh:
                return int(fh.read())
        except (OSError, ValueError):
            return None

    def end_session(self, session_id: str) -> asyncio.Future[Reply]:
        """End a session now; the future is done once every process of it is killed (`closed` waits for it)."""
        return self._end(self._table.get(session_id), "ended by DELETE /sessions")

    def interrupt_session(self, session_id: str) -> None:
        """Interrupt the session's call in progress, if any, as at its time-out (its state is kept)."""
        session = self._table.get(session_id)
        session.zygote.interrupt_session(session.open_id)

    def _end(self, session: SessionRecord, reason: str) -> asyncio.Future[Reply]:
        self._table.forget(session, reason)
        return session.zygote.close_session(session.open_id)

    def _session_died(self, open_id: int, reason: str) -> None:
        session = self._table.by_open_id(open_id)
        if session is not None and self._table.forget(session, reason):
            self.stats.sessions_killed += 1
        snapshot = self._snapshots.by_open_id(open_id)
        if snapshot is not None:
            self._snapshots.forget(snapshot, reason)

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for session, reason in self._table.expired(now, self.config.session_max_lifetime_s):
                self.stats.sessions_expired += 1
                self._end(session, reason)
            for snapshot in self._snapshots.expired(now):
                self._drop_snapshot(snapshot, f"expired: kept for its TTL of {self.config.snapshot_ttl_s:g} s")

    # ---- forks and snapshots -----------------------------------------------------------------
    async def fork_session(self, session_id: str, request: SessionForkRequest) -> SessionForkResponse:
        source = self._table.get(session_id)
        self._check_forkable()
        if request.count > self.config.max_sessions:
            raise InvalidRequest("count", f"count={request.count} is above the server's cap of "
                                          f"{self.config.max_sessions} sessions (--max-sessions)")
        self._reserve(request.count)
        copies = await self._fork_idle(source, request.count, freeze=False)
        sessions = [self._adopt(open_id, group, source.language, source.zygote, source.memory_mb,
                                request.idle_ttl_s or source.idle_ttl_s) for open_id, group in copies]
        if request.reseed:
            await self._reseed(sessions)
        return SessionForkResponse(session_ids=[session.id for session in sessions])

    async def snapshot_session(self, session_id: str) -> SnapshotInfo:
        source = self._table.get(session_id)
        self._check_forkable()
        if len(self._snapshots) >= self.config.max_snapshots:
            self.stats.rejected += 1
            raise Overloaded(f"{len(self._snapshots)} snapshots kept (max_snapshots); delete one, or wait for "
                             f"one to expire")
        [(open_id, _)] = await self._fork_idle(source, 1, freeze=True)
        snapshot = Snapshot(id=self._snapshots.new_id(), language=source.language,
                            zygote=source.zygote, open_id=open_id, memory_mb=source.memory_mb,
                            idle_ttl_s=source.idle_ttl_s, expires_at=time.time() + self.config.snapshot_ttl_s)
        self._snapshots.add(snapshot)
        return self.snapshot_info(snapshot.id)

    async def _fork_idle(self, source: SessionRecord, count: int, freeze: bool) -> list[tuple[int, Optional[str]]]:
        """Copies of a session between calls (409 while one runs), its collector frozen first."""
        if source.busy.locked():
            raise SessionBusy(source.id, "a call is running in it (a fork never copies a half-run call)")
        if source.language == "python":
            await self._quiet_call(source, FREEZE)
        async with source.busy:
            return await self._fork(source.zygote, source.open_id, source.id, source.memory_mb, count, freeze)

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        snapshot = self._snapshots.get(snapshot_id)
        return SnapshotInfo(snapshot_id=snapshot.id, language=snapshot.language,
                            created_at=snapshot.created_at,
                            expires_at=snapshot.expires_at, sessions_started=snapshot.sessions_started,
                            memory_limit_MB=snapshot.memory_mb)

    def snapshots(self) -> list[SnapshotInfo]:
        return [self.snapshot_info(snapshot_id) for snapshot_id in list(self._snapshots.live)]

    def delete_snapshot(self, snapshot_id: str) -> asyncio.Future[Reply]:
        """Drop a snapshot now; the future is done once every process of it is killed."""
        return self._drop_snapshot(self._snapshots.get(snapshot_id), "deleted by DELETE /snapshots")

    def _drop_snapshot(self, snapshot: Snapshot, reason: str) -> asyncio.Future[Reply]:
        if self._snapshots.forget(snapshot, reason):
            return snapshot.zygote.close_session(snapshot.open_id)
        return closed_now()

    async def _start_from(self, request: SessionCreateRequest) -> SessionInfo:
        assert request.from_snapshot is not None
        snapshot = self._snapshots.get(request.from_snapshot)
        if request.language != snapshot.language and "language" in request.model_fields_set:
            raise InvalidRequest("language", f"snapshot {snapshot.id!r} runs {snapshot.language}, not "
                                             f"{request.language}: a session started from it takes its language")
        if request.files:
            raise InvalidRequest("files", "a session started from a snapshot holds the snapshot's files; "
                                          "write more with code")
        self._check_forkable()
        self._reserve(1)
        memory_mb = snapshot.memory_mb if request.memory_limit_MB == -1 else self._memory_mb(request.memory_limit_MB)
        async with snapshot.starting:  # a group's trajectories start together: they queue, never 409
            [(open_id, group)] = await self._fork(snapshot.zygote, snapshot.open_id, snapshot.id, memory_mb, 1,
                                                  freeze=False)
        snapshot.sessions_started += 1
        session = self._adopt(open_id, group, snapshot.language, snapshot.zygote, memory_mb,
                              request.idle_ttl_s or snapshot.idle_ttl_s)
        return self.session_info(session.id)

    def _check_forkable(self) -> None:
        if self._fork_refusal:
            raise ForkUnavailable(self._fork_refusal)

    def _why_no_forks(self) -> str:
        """Why this server cannot fork sessions ("" if it can): fixed at start."""
        if not self.rung.forks:
            return (f"forks and snapshots need the namespaces isolation rung; this server runs "
                    f"{self.rung.name!r} ({self.rung.reason})")
        abi, needed = rungs.landlock_abi(), rungs.LANDLOCK_SCOPED_SIGNALS_ABI
        if abi < needed:
            return (f"forks and snapshots need Landlock ABI {needed} (Linux 6.12) to keep a live parent from "
                    f"signalling its copies; this kernel has ABI {abi}")
        return ""

    def _reserve(self, count: int) -> None:
        """Room for `count` more sessions, under the session cap and the memory cap, or 503."""
        live = len(self._table) + self._table.opening
        if live + count > self.config.max_sessions:
            self.stats.rejected += 1
            raise Overloaded(f"{live} live sessions and {count} more asked for: past max_sessions="
                             f"{self.config.max_sessions}")
        if self.cgroups is not None and self.cgroups.available:
            used = self.cgroups.memory_usage()
            cap = self.config.runs_memory_mb << 20
            if used is not None and used > cap * 0.9:
                self.stats.rejected += 1
                raise Overloaded(f"runs and sessions hold {used >> 20} MB of the server's cap of "
                                 f"{self.config.runs_memory_mb} MB (--runs-memory-mb)")

    async def _fork(self, zygote: ZygoteProcess, open_id: int, name: str, memory_mb: int, count: int,
                    freeze: bool) -> list[tuple[int, Optional[str]]]:
        """The copies' open ids and cgroups; every copy or none."""
        head = jobs.session_fork(open_id, count, self.config, memory_mb, freeze)
        self._table.opening += count
        try:
            forking = asyncio.ensure_future(zygote.fork_session(head))
            try:
                reply = await asyncio.shield(forking)
            except asyncio.CancelledError:  # its client left: the copies are made all the same, and closed
                def close_copies(done: asyncio.Future[Reply]) -> None:
                    for copy in done.result().get("sessions", []):
                        zygote.close_session(copy["id"])
                forking.add_done_callback(close_copies)
                raise
        except SandboxCrashed as exc:
            raise SessionGone(name, f"its sandbox crashed: {exc}") from exc
        finally:
            self._table.opening -= count
        if reply.get("status") != "Finished":
            error = reply.get("error", "the sandbox gave no reason")
            if reply.get("busy"):
                raise SessionBusy(name, error)
            if not reply.get("session_alive", True):
                raise SessionGone(name, error)
            raise ForkFailed(f"{name!r} could not be forked: {error}")
        return [(copy["id"], copy.get("group")) for copy in reply.get("sessions", [])]

    def _adopt(self, open_id: int, group: Optional[str], language: str, zygote: ZygoteProcess, memory_mb: int,
               idle_ttl_s: float) -> SessionRecord:
        session = SessionRecord(id=self._table.new_id(), language=language, zygote=zygote, open_id=open_id,
                          memory_mb=memory_mb, idle_ttl_s=idle_ttl_s, group=group)
        self._table.add(session)
        self.stats.sessions_created += 1
        return session

    async def _quiet_call(self, session: SessionRecord, code: str) -> Reply:
        """A call of the server's own in a session (not counted among its calls)."""
        calls = session.calls
        reply, _ = await self._session_call(session, 10.0, {"code": code, "output_limit": 4096})
        session.calls = calls
        return reply

    async def _reseed(self, sessions: list[SessionRecord]) -> None:
        for session in sessions:
            reply = await self._quiet_call(session, RESEED[session.language])
            if reply.get("return_code") != 0:
                for copy in sessions:
                    self._end(copy, "its random generators could not be reseeded")
                raise ForkFailed(f"reseeding a fork failed: {reply.get('stderr', '')[-500:]}")

    async def _session_call(self, session: SessionRecord, timeout: float, body: SessionCallBody) -> tuple[Reply, float]:
        arrived = time.monotonic()
        head: SessionCallHead = jobs.session_call(session.open_id, timeout, self.config, session.memory_mb)
        await session.busy.acquire()
        try:
            self._admit(session.memory_mb, session)
        except Overloaded:
            session.busy.release()  # refused: the session's next call must not wait for this one
            raise
        call = None
        try:
            lease = await self.slots.acquire()
            queue_wait = time.monotonic() - arrived
            jobs.hand_over(head["limits"], queue_wait)
            try:
                call = asyncio.ensure_future(session.zygote.request(head, encode_body(body)))
                reply = await asyncio.shield(call)
            finally:
                lease.release()
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            # The call goes on to its time-out: the session stays busy till then.
            if call is not None and not call.done():
                busy = session.busy
                call.add_done_callback(lambda _: busy.release())
                raise
            session.busy.release()
            raise
        except SandboxCrashed as exc:
            session.busy.release()
            raise SessionGone(session.id, f"its sandbox crashed: {exc}") from exc
        finally:
            self.stats.in_flight -= 1
        session.busy.release()
        session.calls += 1
        session.idle_since = time.time()
        if not reply.get("session_alive"):
            self._session_died(session.open_id, reply.get("session_end", "its interpreter exited"))
        return reply, queue_wait

    async def _session_run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert request.session_id is not None
        session = self._table.get(request.session_id)
        if request.language != session.language:
            raise InvalidRequest("language", f"session {session.id!r} runs {session.language}, not {request.language}")
        if request.files:
            raise InvalidRequest("files", "files are given when a session is created (POST /sessions); "
                                          "later calls write them with code")
        if session.language == "bash":
            if "\x00" in request.code:
                raise InvalidRequest("code", "bash code cannot contain NUL characters")
            if request.stdin:
                raise InvalidRequest("stdin", "a bash session takes no stdin (its commands read from /dev/null); "
                                              "use a python session, or write the input to a file")
        reply, queue_wait = await self._session_call(session, request.run_timeout, jobs.code_call(request, self.config))
        response = run_response(reply, False, self._context(session.memory_mb, queue_wait, session.id))
        self._count(response)
        return note_session_end(response, reply)

    async def _session_run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        assert request.session_id is not None
        session = self._table.get(request.session_id)
        if session.language != "python":
            raise InvalidRequest("session_id", f"session {session.id!r} runs {session.language}: cells need python")
        reply, queue_wait = await self._session_call(session, request.total_timeout,
                                                     jobs.cells_call(request, self.config))
        response = jupyter_response(reply, len(request.cells), request.total_timeout,
                                    self._context(session.memory_mb, queue_wait, session.id))
        self._count(response)
        return note_session_end(response, reply)
