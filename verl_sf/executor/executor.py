"""The executor: admission, CPU slots, warm interpreters per flavor, and live sessions.

It turns a Sandbox Fusion request into one zygote job (an optional compile stage, then the
run) and the reply into the Sandbox Fusion response.  Admission is a cap on runs in flight
(beyond it: `Overloaded`, a 503); an admitted run waits only for a CPU slot, which runs hold for
their first slice at most (see slots.py), so the wait is short whatever the other runs do.
`run_timeout` counts from the run's start, not counting time it waited for a CPU, and every
reply leaves before the client's deadline (run_timeout + compile_timeout + 10 s, verl's).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import logging
import os
import re
import secrets
import time
from typing import Any, Optional

from verl_sf.errors import VerlSfError
from verl_sf.executor.cgroups import CgroupManager, SandboxCgroup
from verl_sf.executor.config import ExecutorConfig, IsolationMode
from verl_sf.executor.languages import (
    SPECS,
    SourceRejected,
    Toolchains,
    detect_toolchains,
    etc_paths,
)
from verl_sf.executor.sandbox import SandboxLauncher, check_isolation_support, describe
from verl_sf.executor.slots import CpuSlots
from verl_sf.executor.zygote.messages import Limits, Reply, StageResult
from verl_sf.executor.zygote_process import SandboxCrashed, ZygoteProcess, encode_body, next_id
from verl_sf.models import (
    CellRunResult,
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
    SessionCreateRequest,
    SessionInfo,
    summarize_status,
)

log = logging.getLogger(__name__)
LEAN, FULL = "lean", "full"
CLIENT_SLACK_S = 10.0  # verl's reward client waits run_timeout + compile_timeout + this
ENDED_SESSIONS_KEPT = 100_000  # ended sessions whose reason a late call can still be told


class Overloaded(VerlSfError, RuntimeError):
    """Too many runs in flight; the HTTP layer turns this into 503 + Retry-After."""


class SessionNotFound(VerlSfError, LookupError):
    """No live session by that id; `reason` says why (unknown, ended, expired, killed, restarted)."""

    def __init__(self, session_id: str, reason: str):
        super().__init__(f"session {session_id!r}: {reason}")
        self.session_id = session_id
        self.reason = reason


class InvalidRequest(VerlSfError, ValueError):
    """A request that is well-formed but cannot be served as asked; `field` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass
class ExecutorStats:
    in_flight: int = 0
    rejected: int = 0
    cancelled: int = 0
    cpu_starved: int = 0
    sessions_created: int = 0
    sessions_expired: int = 0
    sessions_killed: int = 0


@dataclasses.dataclass
class Session:
    id: str
    language: str
    zygote: ZygoteProcess
    open_id: int
    memory_mb: int
    idle_ttl_s: float
    created_at: float = dataclasses.field(default_factory=time.time)
    idle_since: float = dataclasses.field(default_factory=time.time)
    calls: int = 0
    group: Optional[str] = None
    busy: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class Executor:
    def __init__(self, config: Optional[ExecutorConfig] = None, extra_etc: tuple[str, ...] = ()):
        self.config = config or ExecutorConfig()
        self.stats = ExecutorStats()
        self.instance = secrets.token_hex(3)  # session ids carry it: a restarted server knows they are not its own
        self.toolchains: Optional[Toolchains] = None
        self.cgroups: Optional[CgroupManager] = None
        self.slots = CpuSlots(self.config.slots, self.config.cpu_slice_s)
        self._launcher: Optional[SandboxLauncher] = None
        self._extra_etc = extra_etc
        self._zygotes: dict[str, list[ZygoteProcess]] = {}
        self._heavy_names: Optional[re.Pattern[str]] = None
        self.sessions: dict[str, Session] = {}
        self._by_open_id: dict[int, Session] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._reaper: Optional[asyncio.Task[None]] = None
        self._opening = 0  # sessions being created: they count against max_sessions already

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        warning = describe(self.config)
        if warning:
            log.warning(warning)
        if self.config.isolation == IsolationMode.sandbox:
            check_isolation_support()
            self.cgroups = CgroupManager(f"verl-sf-{os.getpid()}-{id(self):x}", self.config.runs_memory_mb << 20)
            if not self.cgroups.available:
                log.warning("verl-sf: without cgroups, runs are capped by rlimits (RLIMIT_DATA, RLIMIT_NPROC) and a "
                            "memory watchdog that kills a run past its cap: %s", self.cgroups.reason)
        self.toolchains = await asyncio.to_thread(detect_toolchains, self.config.python, self.config.preload,
                                                  self.config.runtime_dir)
        extra_etc = tuple(etc_paths(self.toolchains.available_languages())) + self._extra_etc
        self._launcher = SandboxLauncher(self.config, self.toolchains, extra_etc)
        heavy = self.preloaded()
        if self.config.fast_path and heavy:
            self._heavy_names = re.compile(r"\b(" + "|".join(map(re.escape, heavy)) + r")\b")
        for flavor in [LEAN, *heavy, *([FULL] if len(heavy) > 1 else [])]:
            self._zygotes[flavor] = [self._zygote(flavor, i) for i in range(self.config.sandboxes)]
        await asyncio.gather(*(z.ensure_started() for z in self._zygotes[LEAN]))
        self._reaper = asyncio.create_task(self._expire_sessions())
        missing = sorted(self.toolchains.missing)
        if missing:
            log.info("verl-sf: languages not available here: %s (`verl-sf languages list` says how to add them)",
                     ", ".join(missing))

    def _zygote(self, flavor: str, index: int) -> ZygoteProcess:
        assert self._launcher is not None
        name = f"{flavor}-{index}"
        cgroup: Optional[SandboxCgroup] = self.cgroups.sandbox(name) if self.cgroups else None
        if cgroup is not None:
            cgroup.delegate(self._launcher.host_uids()[0])
        return ZygoteProcess(name, flavor, self._launcher, cgroup, self._session_died)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for session in list(self.sessions.values()):
            self._forget(session, "the server shut down")
        zygotes = [z for group in self._zygotes.values() for z in group]
        await asyncio.gather(*(z.stop() for z in zygotes), return_exceptions=True)
        for zygote in zygotes:
            if zygote.cgroup:
                zygote.cgroup.remove()
        if self.cgroups:
            self.cgroups.remove()
        if self._launcher:
            self._launcher.close()
        self._zygotes = {}

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- introspection ---------------------------------------------------------------------
    @property
    def isolation(self) -> str:
        return self.config.isolation.value

    def languages(self) -> list[str]:
        return self.toolchains.available_languages() if self.toolchains else []

    def preloaded(self) -> list[str]:
        """The heavy libraries served from warm interpreters (those the runtime has)."""
        if self.toolchains is None:
            return []
        return [name for name in self.config.preload if name in self.toolchains.importable]

    def warm_interpreters(self) -> dict[str, int]:
        """Running warm interpreters by flavor (heavy ones start on first use)."""
        running = {flavor: sum(1 for z in group if z.process is not None and z.process.returncode is None)
                   for flavor, group in self._zygotes.items()}
        return {flavor: count for flavor, count in running.items() if count}

    def faults(self) -> dict[str, str]:
        """Sandboxes whose last reply reader failed, by name, with why."""
        return {z.name: z.fault for group in self._zygotes.values() for z in group if z.fault}

    def cgroups_status(self) -> str:
        if self.cgroups is None:
            return "off"
        return "on" if self.cgroups.available else self.cgroups.reason

    def limits_status(self) -> dict[str, str]:
        """How each cap is enforced here, for /health: nothing is silently missing."""
        if self.config.isolation == IsolationMode.none:
            return {"memory": "none (isolation none)", "processes": "RLIMIT_NPROC", "uid": "the server's"}
        cgroups = self.cgroups is not None and self.cgroups.available
        single = self._launcher is not None and self._launcher.single_uid
        return {
            "memory": "cgroup per run" if cgroups else
                      "RLIMIT_DATA per process and a watchdog that kills a run past its cap (no writable cgroup)",
            "processes": "pids cgroup per run" if cgroups else "RLIMIT_NPROC, shared by runs of one uid",
            "uid": "the server's own uid, no capabilities (single-uid user namespace)" if single else
                   f"host uid {self.config.host_uid_base + self.config.sandbox_uid}, not root",
            "seccomp": "on",
        }

    # ---- admission -------------------------------------------------------------------------
    def _admit(self, memory_mb: int, caller: Optional[Session] = None) -> None:
        if self.stats.in_flight >= self.config.max_in_flight:
            self.stats.rejected += 1
            raise Overloaded(f"{self.stats.in_flight} runs in flight (max_in_flight={self.config.max_in_flight})")
        self._make_room(memory_mb, caller)
        self.stats.in_flight += 1

    def _make_room(self, memory_mb: int, caller: Optional[Session]) -> None:
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
        idle = sorted((s for s in self.sessions.values() if s is not caller and not s.busy.locked()),
                      key=lambda s: s.idle_since)
        for session in idle:
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
        """The smallest warm interpreter that has what the code names: lean, the one library's, or full.
        Only a speed choice: code that imports a library anyway still works from any interpreter."""
        if self._heavy_names is None:
            return LEAN
        named = set(self._heavy_names.findall(code))
        if not named:
            return LEAN
        return named.pop() if len(named) == 1 else FULL

    def _memory_mb(self, requested: int) -> int:
        return self.config.default_memory_mb if requested == -1 else requested

    def _limits(self, timeout: float, budget: float, memory_mb: int) -> Limits:
        """`budget`: what the client waits in all; the reply must leave `reply_margin_s` before it.
        `hard_timeout` counts from the request's arrival until `_hand_over` makes it count from then."""
        return {"timeout": timeout, "hard_timeout": budget - self.config.reply_margin_s,
                "output_limit": self.config.output_limit_bytes, "memory": memory_mb << 20,
                "nproc": self.config.max_processes}

    @staticmethod
    def _hand_over(limits: Limits, arrived: float) -> float:
        """Just before the zygote gets the job: the time it waited (for a slot, a busy session) comes
        off its hard limit, so the reply still leaves before the client's deadline.  Returns that wait."""
        waited = time.monotonic() - arrived
        limits["hard_timeout"] = max(limits["hard_timeout"] - waited, limits["timeout"])
        return waited

    def _body_limits(self, memory_mb: int) -> dict[str, Any]:
        cfg = self.config
        return {"fsize": cfg.max_file_size_mb << 20, "nofile": cfg.max_open_files, "nproc": cfg.max_processes,
                "memory": memory_mb << 20, "output_limit": cfg.output_limit_bytes}

    async def _job(self, flavor: str, head: dict[str, Any], body: dict[str, Any],
                   arrived: float) -> tuple[Reply, float]:
        """Admitted already: wait for a CPU slot, run, and give the slot back."""
        try:
            lease = await self.slots.acquire()
            try:
                zygote = await self._pick(flavor)
                queue_wait = self._hand_over(head["limits"], arrived)
                reply = await zygote.request(head, encode_body(body))  # type: ignore[arg-type]
            finally:
                lease.release()
        except asyncio.CancelledError:  # its client went away, whether it was queued or running
            self.stats.cancelled += 1
            raise
        return reply, queue_wait

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
        written = {source.filename: source.code, **source.extra_files}
        files = {**{k: v or "" for k, v in request.files.items()},
                 **{name: base64.b64encode(text.encode()).decode() for name, text in written.items()}}
        body: dict[str, Any] = {**self._body_limits(memory_mb), "stdin": request.stdin,
                                "fetch_files": request.fetch_files, "files": files}
        flavor = LEAN
        if request.language == "python" and self.config.fast_path:
            body.update(mode="python", code=request.code)
            del files[source.filename]
            flavor = self._flavor_for(request.code)
        else:
            body.update(mode="exec", argv=self.toolchains.argv(spec.run, source.params))
            if spec.compile:
                body["compile_argv"] = self.toolchains.argv(spec.compile, source.params)
        budget = request.run_timeout + request.compile_timeout + CLIENT_SLACK_S
        head = {"op": "run", "id": next_id(), "compile_timeout": request.compile_timeout if spec.compile else 0,
                "exec": body["mode"] == "exec", "limits": self._limits(request.run_timeout, budget, memory_mb)}
        self._admit(memory_mb)
        try:
            reply, queue_wait = await self._job(flavor, head, body, arrived)
        except SandboxCrashed as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=f"sandbox failed: {exc}",
                                   run_result=CommandRunResult(status=CommandRunStatus.Error),
                                   executor_pod_name=self.config.pod_name)
        finally:
            self.stats.in_flight -= 1
        return self._run_response(reply, bool(spec.compile), memory_mb, queue_wait)

    def _run_response(self, reply: Reply, compiled: bool, memory_mb: int, queue_wait: float,
                      session_id: Optional[str] = None) -> RunCodeResponse:
        if reply.get("error") and "status" not in reply:
            return RunCodeResponse(status=RunStatus.SandboxError, message=reply["error"],
                                   executor_pod_name=self.config.pod_name, queue_wait=queue_wait, session_id=session_id)
        compile_result = run_result = None
        if compiled and "compile" in reply:
            compile_result = self._command_result(reply["compile"], memory_mb)
            if compile_result.return_code == 0:
                run_result = self._command_result(reply, memory_mb)
        elif compiled:
            compile_result = self._command_result(reply, memory_mb)  # the compile stage itself timed out or died
        else:
            run_result = self._command_result(reply, memory_mb)
        status = summarize_status(compile_result, run_result)
        message = "" if status == RunStatus.Success else _message(compile_result, run_result)
        if run_result is not None and run_result.cpu_starved:
            # Still Sandbox Fusion's Failed + TimeLimitExceeded (what its clients score as a time-out);
            # the field tells verl-sf's tool and rewards that the code is not to blame.
            message = "run_timeout exceeded while the run mostly waited for a CPU (server overloaded)"
        return RunCodeResponse(status=status, message=message, compile_result=compile_result, run_result=run_result,
                               files=reply.get("files", {}), executor_pod_name=self.config.pod_name,
                               queue_wait=queue_wait, truncated=bool(reply.get("truncated")), session_id=session_id)

    def _command_result(self, stage: StageResult, memory_mb: int) -> CommandRunResult:
        stderr = stage.get("stderr", "")
        if stage.get("memory_exceeded"):
            if stage.get("memory_scope") == "shared":
                stderr += (f"\n[verl-sf: killed for memory: the runs and sessions of this server together reached "
                           f"its cap of {self.config.runs_memory_mb} MB (--runs-memory-mb); this run was within "
                           f"its own limit of {memory_mb} MB]\n")
            else:
                stderr += f"\n[verl-sf: killed: memory limit of {memory_mb} MB exceeded]\n"
        if stage.get("cpu_starved"):
            self.stats.cpu_starved += 1
        return CommandRunResult(status=CommandRunStatus(stage.get("status", "Error")),
                                execution_time=stage.get("execution_time"), cpu_time=stage.get("cpu_time"),
                                cpu_wait_time=stage.get("cpu_wait_time"), cpu_starved=bool(stage.get("cpu_starved")),
                                return_code=stage.get("return_code"), stdout=stage.get("stdout", ""), stderr=stderr)

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        assert self.toolchains is not None, "Executor.start() first"
        if request.session_id is not None:
            return await self._session_run_jupyter(request)
        arrived = time.monotonic()
        memory_mb = self.config.default_memory_mb
        body = {**self._body_limits(memory_mb), "mode": "jupyter", "cells": request.cells,
                "cell_timeout": request.cell_timeout, "files": {k: v or "" for k, v in request.files.items()},
                "fetch_files": request.fetch_files}
        head = {"op": "run", "id": next_id(), "compile_timeout": 0, "exec": False,
                "limits": self._limits(request.total_timeout, request.total_timeout + CLIENT_SLACK_S, memory_mb)}
        self._admit(memory_mb)
        try:
            reply, queue_wait = await self._job(self._flavor_for("\n".join(request.cells)), head, body, arrived)
        except SandboxCrashed as exc:
            return RunJupyterResponse(status=RunStatus.SandboxError, message=f"sandbox failed: {exc}",
                                      executor_pod_name=self.config.pod_name)
        finally:
            self.stats.in_flight -= 1
        return self._jupyter_response(reply, len(request.cells), request.total_timeout, memory_mb, queue_wait)

    def _jupyter_response(self, reply: Reply, n_cells: int, timeout: float, memory_mb: int, queue_wait: float,
                          session_id: Optional[str] = None) -> RunJupyterResponse:
        driver = self._command_result(reply, memory_mb)
        cells = [CellRunResult(**cell) for cell in reply.get("cells", [])]
        if driver.status == CommandRunStatus.TimeLimitExceeded:
            message = f"total_timeout of {timeout:g} s exceeded after {len(cells)} of {n_cells} cells"
            cells += [CellRunResult(error=[{"ename": "TimeoutError", "evalue": message, "traceback": []}])
                      for _ in range(n_cells - len(cells))]
            status = RunStatus.Failed
        elif driver.status == CommandRunStatus.Error or driver.return_code != 0:
            message = f"the kernel died: {driver.stderr or driver.return_code}"
            status = RunStatus.Failed if driver.status != CommandRunStatus.Error else RunStatus.SandboxError
        else:
            message, status = "", RunStatus.Success
        return RunJupyterResponse(status=status, message=message, driver=driver, cells=cells,
                                  files=reply.get("files", {}), executor_pod_name=self.config.pod_name,
                                  queue_wait=queue_wait, truncated=bool(reply.get("truncated")), session_id=session_id)

    # ---- sessions --------------------------------------------------------------------------
    async def create_session(self, request: SessionCreateRequest) -> SessionInfo:
        assert self.toolchains is not None, "Executor.start() first"
        if request.language == "bash" and "bash" in self.toolchains.missing:
            raise InvalidRequest("language", self.toolchains.missing_message("bash"))
        if len(self.sessions) + self._opening >= self.config.max_sessions:
            idle = [s for s in self.sessions.values() if not s.busy.locked()]  # a session in a call is not idle
            if not idle:
                self.stats.rejected += 1
                raise Overloaded(f"{len(self.sessions)} live sessions (max_sessions), all running a call")
            oldest = min(idle, key=lambda s: s.idle_since)
            self._end(oldest, f"evicted: the server's cap of {self.config.max_sessions} live sessions was reached "
                              f"and it was the longest idle")
        memory_mb = self._memory_mb(request.memory_limit_MB)
        ttl = request.idle_ttl_s or self.config.session_idle_ttl_s
        zygote = await self._pick(LEAN)
        open_id = next_id()
        session = Session(id=f"{self.instance}-{secrets.token_hex(8)}", language=request.language, zygote=zygote,
                          open_id=open_id, memory_mb=memory_mb, idle_ttl_s=ttl)
        head = {"op": "open", "id": open_id, "language": request.language,
                "limits": self._limits(30.0, 30.0, memory_mb)}
        body = {**self._body_limits(memory_mb), "mode": f"session_{request.language}",
                "files": {k: v or "" for k, v in request.files.items()}}
        zygote.sessions.add(open_id)
        opening = asyncio.ensure_future(zygote.request(head, encode_body(body)))  # type: ignore[arg-type]
        self._opening += 1
        try:
            reply = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # Its client left: the session is opened all the same and closed at once, never left unrecorded.
            opening.add_done_callback(lambda done: self._roll_back(zygote, open_id, done))
            raise
        finally:
            self._opening -= 1
        if not reply.get("session_alive"):
            zygote.sessions.discard(open_id)
            why = reply.get("stderr") or reply.get("session_end")
            raise InvalidRequest("files", f"the session could not start: {why}")
        session.group = reply.get("group")
        self.sessions[session.id] = session
        self._by_open_id[open_id] = session
        self.stats.sessions_created += 1
        return self.session_info(session.id)

    @staticmethod
    def _roll_back(zygote: ZygoteProcess, open_id: int, opening: asyncio.Future[Reply]) -> None:
        zygote.sessions.discard(open_id)
        if not opening.cancelled() and opening.exception() is None and opening.result().get("session_alive"):
            zygote.send({"op": "close", "id": next_id(), "session": open_id})

    def session_info(self, session_id: str) -> SessionInfo:
        session = self._live(session_id)
        return SessionInfo(session_id=session.id, language=session.language, alive=True,
                           created_at=session.created_at, idle_since=session.idle_since, idle_ttl_s=session.idle_ttl_s,
                           calls=session.calls, memory_bytes=self._session_memory(session),
                           memory_limit_MB=session.memory_mb, executor_pod_name=self.config.pod_name)

    def _session_memory(self, session: Session) -> Optional[int]:
        cgroup = session.zygote.cgroup
        if cgroup is None or session.group is None or "memory" not in cgroup.dirs:
            return None
        name = "memory.current" if cgroup.v2 else "memory.usage_in_bytes"
        try:
            with open(os.path.join(cgroup.dirs["memory"], session.group, name)) as fh:
                return int(fh.read())
        except (OSError, ValueError):
            return None

    def end_session(self, session_id: str) -> None:
        self._end(self._live(session_id), "ended by DELETE /sessions")

    def _live(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        reason = self._ended.get(session_id)
        if reason is None:
            if not session_id.startswith(self.instance + "-") and re.fullmatch(r"[0-9a-f]{6}-[0-9a-f]{16}", session_id):
                reason = "the server restarted since it was created: sessions do not survive a restart"
            else:
                reason = "no such session"
        raise SessionNotFound(session_id, reason)

    def _end(self, session: Session, reason: str) -> None:
        self._forget(session, reason)
        session.zygote.sessions.discard(session.open_id)
        session.zygote.send({"op": "close", "id": next_id(), "session": session.open_id})

    def _forget(self, session: Session, reason: str) -> None:
        if self.sessions.pop(session.id, None) is None:
            return
        self._by_open_id.pop(session.open_id, None)
        self._ended[session.id] = reason
        while len(self._ended) > ENDED_SESSIONS_KEPT:
            self._ended.popitem(last=False)

    def _session_died(self, open_id: int, reason: str) -> None:
        session = self._by_open_id.get(open_id)
        if session is not None:
            self.stats.sessions_killed += 1
            self._forget(session, reason)

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for session in list(self.sessions.values()):
                if session.busy.locked():
                    continue
                if now - session.idle_since > session.idle_ttl_s:
                    self.stats.sessions_expired += 1
                    self._end(session, f"expired: idle for {now - session.idle_since:.0f} s "
                                       f"(idle_ttl_s={session.idle_ttl_s:g})")
                elif now - session.created_at > self.config.session_max_lifetime_s:
                    self.stats.sessions_expired += 1
                    self._end(session, f"expired: reached the maximum lifetime of "
                                       f"{self.config.session_max_lifetime_s:g} s")

    async def _session_call(self, session: Session, timeout: float, body: Any) -> tuple[Reply, float]:
        arrived = time.monotonic()
        limits = self._limits(timeout, timeout + CLIENT_SLACK_S, session.memory_mb)
        head = {"op": "call", "id": next_id(), "session": session.open_id,
                "grace": self.config.session_interrupt_grace_s, "limits": limits}
        await session.busy.acquire()
        try:
            self._admit(session.memory_mb, session)
        except Overloaded:
            session.busy.release()  # refused: the session's next call must not wait for this one
            raise
        call = None
        try:
            lease = await self.slots.acquire()
            queue_wait = self._hand_over(limits, arrived)
            try:
                call = asyncio.ensure_future(session.zygote.request(head, body))  # type: ignore[arg-type]
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
            raise SessionNotFound(session.id, f"its sandbox crashed: {exc}") from exc
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
        session = self._live(request.session_id)
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
            body = encode_body({"code": request.code, "fetch_files": request.fetch_files})
        else:
            body = encode_body({"code": request.code, "stdin": request.stdin,
                                "output_limit": self.config.output_limit_bytes,
                                "fetch_files": request.fetch_files or None})
        reply, queue_wait = await self._session_call(session, request.run_timeout, body)
        response = self._run_response(reply, False, session.memory_mb, queue_wait, session.id)
        return _note_session_end(response, reply)

    async def _session_run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        assert request.session_id is not None
        session = self._live(request.session_id)
        if session.language != "python":
            raise InvalidRequest("session_id", f"session {session.id!r} runs {session.language}: cells need python")
        body = encode_body({"cells": request.cells, "cell_timeout": request.cell_timeout,
                            "output_limit": self.config.output_limit_bytes, "fetch_files": request.fetch_files or None})
        reply, queue_wait = await self._session_call(session, request.total_timeout, body)
        response = self._jupyter_response(reply, len(request.cells), request.total_timeout, session.memory_mb,
                                          queue_wait, session.id)
        return _note_session_end(response, reply)


def _note_session_end(response: Any, reply: Reply) -> Any:
    """A call that ended its session says so (killed at its time-out, for memory, by exit)."""
    response.session_alive = bool(reply.get("session_alive"))
    if not reply.get("session_alive"):
        note = f"the session ended: {reply.get('session_end', 'its interpreter exited')}"
        response.message = f"{response.message}; {note}" if response.message else note
    elif reply.get("status") == "TimeLimitExceeded":
        response.message = f"{response.message}; the call was interrupted and the session lives on"
    return response


def _message(compile_result: Optional[CommandRunResult], run_result: Optional[CommandRunResult]) -> str:
    if compile_result is not None and run_result is None:
        return "compilation failed" if compile_result.status == CommandRunStatus.Finished else \
            f"compilation: {compile_result.status.value}"
    if run_result is None:
        return ""
    if run_result.status == CommandRunStatus.TimeLimitExceeded:
        return "run_timeout exceeded"
    if run_result.status == CommandRunStatus.Error:
        return "sandbox error"
    return f"exited with return code {run_result.return_code}"
