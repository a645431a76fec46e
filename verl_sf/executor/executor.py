"""The executor: a facade over its rooms, which it starts, stops and reports on (status.py).

- pool.py: warm interpreters per flavor, each in a sandbox;
- admission.py: the cap on runs in flight, room under the memory cap, CPU and GPU slots;
- runs.py: stateless runs, a request made a zygote job (jobs.py) and its reply a response (responses.py);
- sessions.py: live sessions, their calls, ends, expiry and eviction;
- forks.py: forks and snapshots of sessions.

Every reply leaves before the client's deadline (run_timeout + compile_timeout + 10 s, verl's).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Optional

from verl_sf.errors import ForkFailed, InvalidRequest, Overloaded
from verl_sf.executor import rungs
from verl_sf.executor.admission import Admission
from verl_sf.executor.cgroups import CgroupManager
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.forks import Forks, why_no_forks
from verl_sf.executor.gpu_slots import GpuSlots
from verl_sf.executor.gpus import host_gpus, parse_gpu_choice
from verl_sf.executor.languages import Toolchains, detect_toolchains, etc_paths
from verl_sf.executor.pool import ZygotePool
from verl_sf.executor.runs import Runs
from verl_sf.executor.session_table import SessionRecord
from verl_sf.executor.sessions import Sessions
from verl_sf.executor.slots import CpuSlots
from verl_sf.executor.status import ExecutorStats, ExecutorStatus
from verl_sf.executor.zygote.paths import RUN_TMP, split_path
from verl_sf.executor.zygote_process import Closed, Closing
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreateRequest,
    SessionForkRequest,
    SessionForkResponse,
    SessionInfo,
    SnapshotInfo,
)

log = logging.getLogger(__name__)

__all__ = ["Executor", "ExecutorStats", "ExecutorStatus", "ForkFailed", "InvalidRequest", "Overloaded"]


class Executor:
    def __init__(self, config: Optional[ExecutorConfig] = None, extra_etc: tuple[str, ...] = ()):
        self.config = config or ExecutorConfig()
        self.stats = ExecutorStats()
        self.toolchains: Optional[Toolchains] = None
        self.cgroups: Optional[CgroupManager] = None
        self.rung: rungs.Rung = rungs.Unisolated("not started")  # chosen at start
        self._extra_etc = extra_etc
        self._pool: Optional[ZygotePool] = None  # these two at start
        self._runs: Optional[Runs] = None
        self._admission = Admission(self.config, self.stats, lambda memory_mb: self._sessions.make_room(memory_mb))
        self._sessions = Sessions(self.config, self.stats, self._admission)
        self._forks = Forks(self.config, self._admission, self._sessions)
        self._reaper: Optional[asyncio.Task[None]] = None

    @property
    def sessions(self) -> dict[str, SessionRecord]:
        """Live sessions by id."""
        return self._sessions.table.live

    @property
    def slots(self) -> CpuSlots:
        return self._admission.slots

    @property
    def gpu_slots(self) -> Optional[GpuSlots]:
        return self._admission.gpu_slots

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.rung = await asyncio.to_thread(rungs.choose, self.config.isolation)
        self._forks.refusal = why_no_forks(self.rung)
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
        self._admission.cgroups = self.cgroups
        present = host_gpus()
        chosen = parse_gpu_choice(self.config.gpus, present)
        self.toolchains = await asyncio.to_thread(detect_toolchains, self.config.python, self.config.preload,
                                                  self.config.runtime_dir)
        if not chosen:
            self.toolchains.refuse_gpu_languages(
                f"needs a GPU given to the server (`verl-sf serve --gpus all`; this host has {len(present)})"
                if present else "needs an NVIDIA GPU and the CUDA toolkit: this host has no GPU (no /dev/nvidiactl "
                                "with a /dev/nvidiaN beside it)")
        else:
            self._admission.gpu_slots = GpuSlots(chosen, self.config.runs_per_gpu)
        extra_etc = tuple(etc_paths(self.toolchains.available_languages())) + self._extra_etc
        self._pool = ZygotePool(self.config, self.rung, self.toolchains, self.cgroups, extra_etc, self._died)
        if self._pool.launcher.run_uid_range()[1]:  # runs of uids of their own: toolchains they cannot reach
            self.toolchains.refuse_out_of_reach(self._pool.launcher.unreachable_dirs())
        self._sessions.pool = self._pool
        self._runs = Runs(self.config, self.stats, self._admission, self._pool, self.toolchains)
        await self._pool.start(chosen)
        self._reaper = asyncio.create_task(self._expire())
        missing = sorted(self.toolchains.missing)
        if missing:
            log.info("verl-sf: languages not available here: %s (`verl-sf languages list` says how to add them)",
                     ", ".join(missing))

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for session in list(self.sessions.values()):
            self._sessions.table.forget(session, "the server shut down")
        if self._pool is not None:
            await self._pool.close()
        if self.cgroups:
            self.cgroups.remove()

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _died(self, open_id: int, reason: str) -> None:
        """A session's or a snapshot's interpreter died (its zygote said so)."""
        self._sessions.died(open_id, reason)
        self._forks.died(open_id, reason)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            self._sessions.expire(now)
            self._forks.expire(now)

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
        config, toolchains, pool = self.config, self.toolchains, self._pool
        cgroups = "off" if self.cgroups is None else "on" if self.cgroups.available else self.cgroups.reason
        limits = self.rung.limits(self.cgroups is not None and self.cgroups.available)
        if self.cgroups is not None and self.cgroups.available:
            past = "past its first slice of CPU" if self.cgroups.cpu_counter else "past its first slice"
            limits["cpu"] = (f"cgroup per run, its weight the least {past}" if self.cgroups.cpu_per_run
                             else f"nice 19 {past} (no cpu cgroup of the server's)")
        if self.rung.confined and pool is not None:
            limits.update(pool.launcher.uid_status())
        return ExecutorStatus(
            faults=pool.faults() if pool else {}, isolation=self.isolation, cgroups=cgroups,
            fast_path=config.fast_path, preloaded=pool.preloaded if pool else [],
            warm_interpreters=pool.running() if pool else {},
            languages=toolchains.available_languages() if toolchains else [],
            missing_languages=toolchains.missing_summary() if toolchains else {}, limits=limits,
            slots=config.slots, sandboxes=config.sandboxes, in_flight=self.stats.in_flight, queued=self.slots.waiting,
            gpus=self._admission.gpus(), max_in_flight=config.max_in_flight, sessions=len(self.sessions),
            max_sessions=config.max_sessions, snapshots=len(self._forks.snapshots), max_snapshots=config.max_snapshots,
            counts=dataclasses.replace(self.stats))

    # ---- runs, sessions, forks and snapshots ------------------------------------------------
    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        if request.session_id is not None:
            return await self._sessions.run_code(request)
        self._check_files(request.files)
        assert self._runs is not None, "Executor.start() first"
        return await self._runs.run_code(request)

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        if request.session_id is not None:
            return await self._sessions.run_jupyter(request)
        self._check_files(request.files)
        assert self._runs is not None, "Executor.start() first"
        return await self._runs.run_jupyter(request)

    async def create_session(self, request: SessionCreateRequest, cells: bool = False,
                             rooted: bool = False) -> SessionInfo:
        """`cells`: the session will mostly run cells (an E2B sandbox): it is forked from a zygote
        whose IPython shell is built already.  `rooted`: its commands may run as root, where the rung
        offers it (`offers_root`)."""
        assert self.toolchains is not None, "Executor.start() first"
        if request.from_snapshot is not None:
            return await self._forks.start_from(request)
        if request.language == "bash" and "bash" in self.toolchains.missing:
            raise InvalidRequest("language", self.toolchains.missing_message("bash"))
        self._check_files(request.files)
        return await self._sessions.create(request, cells, rooted and self.offers_root)

    def _check_files(self, files: dict[str, Optional[str]]) -> None:
        """Without a view of its own (the landlock rung) a run has one directory, which `/workdir`
        names: a file elsewhere (`/tmp`, `/mnt/data`), or one where its TMPDIR is, is the request's to fix,
        not the code's failure."""
        if self.rung.isolated:
            return
        for path in files:
            if path.startswith("/") and not path.startswith("/workdir/"):
                raise InvalidRequest("files", f"file path {path!r}: on the {self.rung.name} isolation rung a run has "
                                              "one directory, its working directory (no /tmp or /mnt/data of its "
                                              "own): name the file relative to it or under /workdir")
            if split_path(path, ["/workdir"])[1] == [RUN_TMP]:
                raise InvalidRequest("files", f"file path {path!r}: on the {self.rung.name} isolation rung "
                                              f"{RUN_TMP!r} in the working directory is the run's TMPDIR; "
                                              "name the file otherwise")

    def session_info(self, session_id: str) -> SessionInfo:
        return self._sessions.info(session_id)

    def session_end_reason(self, session_id: str) -> Optional[str]:
        """Why a session that ended did (kept for a while), or None."""
        return self._sessions.table.ended(session_id)

    def end_session(self, session_id: str, reason: str = "ended by DELETE /sessions") -> Closing[Closed]:
        """End a session now, for `reason` (what its calls in flight and later are told); the future is
        done once every process of it is killed (`closed` waits for it)."""
        return self._sessions.end_record(self._sessions.table.get(session_id), reason)

    def interrupt_session(self, session_id: str) -> None:
        """Interrupt the session's call in progress, if any, as at its time-out (its state is kept)."""
        self._sessions.interrupt(session_id)

    async def fork_session(self, session_id: str, request: SessionForkRequest) -> SessionForkResponse:
        return await self._forks.fork_session(session_id, request)

    async def snapshot_session(self, session_id: str) -> SnapshotInfo:
        return await self._forks.snapshot_session(session_id)

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return self._forks.info(snapshot_id)

    def snapshots(self) -> list[SnapshotInfo]:
        return [self._forks.info(snapshot_id) for snapshot_id in list(self._forks.snapshots.live)]

    def delete_snapshot(self, snapshot_id: str) -> Closing[Closed]:
        """Drop a snapshot now; the future is done once every process of it is killed."""
        return self._forks.drop(self._forks.snapshots.get(snapshot_id), "deleted by DELETE /snapshots")
