"""The executor: a pool of sandbox slots behind a bounded FIFO queue.

It turns a Sandbox Fusion request into zygote jobs (an optional compile stage, then the
run), and their results into the Sandbox Fusion response.  Queueing happens here, before
a slot is taken, so `run_timeout` only ever counts time spent running; the wait is
reported as `queue_wait`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import logging
import os
import re
import time
from typing import Any, Optional

from verl_sf.executor.cgroups import CgroupManager
from verl_sf.executor.config import ExecutorConfig, IsolationMode
from verl_sf.executor.languages import (
    SPECS,
    SourceRejected,
    Toolchains,
    detect_toolchains,
)
from verl_sf.executor.sandbox import SandboxLauncher, check_isolation_support, describe
from verl_sf.executor.slot import FULL, LEAN, Slot, SlotCrashed
from verl_sf.executor.slot_queue import SlotQueue
from verl_sf.models import (
    CellRunResult,
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
    summarize_status,
)

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """The wait queue is full; the HTTP layer turns this into 503 + Retry-After."""


@dataclasses.dataclass
class ExecutorStats:
    in_flight: int = 0
    queued: int = 0
    rejected: int = 0


class Executor:
    def __init__(self, config: Optional[ExecutorConfig] = None):
        self.config = config or ExecutorConfig()
        self.stats = ExecutorStats()
        self.toolchains: Optional[Toolchains] = None
        self.cgroups: Optional[CgroupManager] = None
        self._launcher: Optional[SandboxLauncher] = None
        self._slots: list[Slot] = []
        self._heavy_names: Optional[re.Pattern[str]] = None
        self._idle = SlotQueue()

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        warning = describe(self.config)
        if warning:
            log.warning(warning)
        if self.config.isolation == IsolationMode.sandbox:
            check_isolation_support()
            self.cgroups = CgroupManager(f"verl-sf-{os.getpid()}-{id(self):x}")
        self.toolchains = await asyncio.to_thread(detect_toolchains, self.config.python, self.config.preload,
                                                  self.config.runtime_dir)
        absent = sorted(self.toolchains.missing)
        if absent:
            log.info("languages without a toolchain here (`verl-sf languages list` says how to add them): %s",
                     ", ".join(absent))
        self._launcher = SandboxLauncher(self.config, self.toolchains)
        cgroups = self.cgroups if self.cgroups and self.cgroups.available else None
        self._slots = [Slot(i, self._launcher, cgroups.slot(i) if cgroups else None) for i in range(self.config.workers)]
        heavy = self.preloaded()
        if self.config.fast_path and heavy:
            self._heavy_names = re.compile(r"\b(" + "|".join(map(re.escape, heavy)) + r")\b")
        for slot in self._slots:
            if slot.cgroup:
                slot.cgroup.set_pids_limit(self.config.max_processes + 8)
        await asyncio.gather(*(slot.start() for slot in self._slots))
        for slot in self._slots:
            self._idle.put(slot)

    async def close(self) -> None:
        await asyncio.gather(*(slot.stop() for slot in self._slots), return_exceptions=True)
        for slot in self._slots:
            if slot.cgroup:
                slot.cgroup.remove()
        if self.cgroups:
            self.cgroups.remove()
        if self._launcher:
            self._launcher.close()
        self._slots = []

    async def __aenter__(self) -> "Executor":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- introspection ---------------------------------------------------------------
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
        """Running warm interpreters by flavor, summed over slots (heavy ones start on first use)."""
        return dict(collections.Counter(flavor for slot in self._slots for flavor in slot.zygotes))

    def cgroups_status(self) -> str:
        if self.cgroups is None:
            return "off"
        return "on" if self.cgroups.available else self.cgroups.reason

    # ---- admission -------------------------------------------------------------------
    async def _acquire(self, flavor: str) -> tuple[Slot, float]:
        arrived = time.monotonic()
        if not self._idle.has_idle() and self.stats.queued >= self.config.max_queue:
            self.stats.rejected += 1
            raise Overloaded(f"{self.stats.queued} requests already waiting (max_queue={self.config.max_queue})")
        self.stats.queued += 1
        try:
            slot = await self._idle.get(prefer=lambda candidate: flavor in candidate.zygotes)
        finally:
            self.stats.queued -= 1
        self.stats.in_flight += 1
        return slot, time.monotonic() - arrived

    def _release(self, slot: Slot) -> None:
        self.stats.in_flight -= 1
        self._idle.put(slot)

    # ---- requests --------------------------------------------------------------------
    def _limits(self, timeout: float) -> dict[str, Any]:
        cfg = self.config
        return {"timeout": timeout, "output_limit": cfg.output_limit_bytes, "fsize": cfg.max_file_size_mb << 20,
                "nofile": cfg.max_open_files, "nproc": cfg.max_processes}

    def _flavor_for(self, code: str) -> str:
        """The smallest warm interpreter that has what the code names: lean, the one library's, or full.

        Only a speed choice: code that imports a library anyway (say via __import__) still
        works from any interpreter, it just pays for the import."""
        if self._heavy_names is None:
            return LEAN
        named = set(self._heavy_names.findall(code))
        if not named:
            return LEAN
        return named.pop() if len(named) == 1 else FULL

    def _memory_mb(self, requested: int) -> int:
        return self.config.default_memory_mb if requested == -1 else requested

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert self.toolchains is not None, "Executor.start() first"
        spec = SPECS[request.language]
        if request.language in self.toolchains.missing:
            return RunCodeResponse(status=RunStatus.SandboxError, message=self.toolchains.missing_message(request.language),
                                   executor_pod_name=self.config.pod_name)
        try:
            source = spec.prepare_source(request.code)
        except SourceRejected as exc:
            rejected = CommandRunResult(status=CommandRunStatus.Finished, return_code=1, stderr=str(exc))
            return self._response(rejected, None, {}, 0.0, {})
        written = {source.filename: source.code, **source.extra_files}
        files = {**{k: v or "" for k, v in request.files.items()},
                 **{name: base64.b64encode(text.encode()).decode() for name, text in written.items()}}
        use_fast_path = request.language == "python" and self.config.fast_path
        run_job: dict[str, Any] = {**self._limits(request.run_timeout), "stdin": request.stdin,
                                   "fetch_files": request.fetch_files, "last": True}
        flavor = LEAN
        if use_fast_path:
            run_job.update(mode="python", code=request.code)
            files = {k: v for k, v in files.items() if k != source.filename}
            flavor = self._flavor_for(request.code)
        else:
            run_job.update(mode="exec", argv=self.toolchains.argv(spec.run, source.params))
        memory_mb = self._memory_mb(request.memory_limit_MB)
        slot, queue_wait = await self._acquire(flavor)
        try:
            compile_result = None
            if spec.compile:
                compile_job = {**self._limits(request.compile_timeout), "mode": "exec", "files": files, "last": False,
                               "argv": self.toolchains.argv(spec.compile, source.params)}
                compile_reply = await slot.job(compile_job, memory_mb, flavor)
                compile_result = _command_result(compile_reply, memory_mb)
                if compile_result.status != CommandRunStatus.Finished or compile_result.return_code != 0:
                    await slot.job({"mode": "wipe"}, memory_mb, flavor)
                    return self._response(compile_result, None, {}, queue_wait, compile_reply)
            else:
                run_job["files"] = files
            run_reply = await slot.job(run_job, memory_mb, flavor)
        except SlotCrashed as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=f"sandbox slot failed: {exc}",
                                   run_result=CommandRunResult(status=CommandRunStatus.Error),
                                   executor_pod_name=self.config.pod_name, queue_wait=queue_wait)
        finally:
            self._release(slot)
        run_result = _command_result(run_reply, memory_mb)
        return self._response(compile_result, run_result, run_reply.get("files", {}), queue_wait, run_reply)

    def _response(self, compile_result: Optional[CommandRunResult], run_result: Optional[CommandRunResult],
                  files: dict[str, str], queue_wait: float, reply: dict[str, Any]) -> RunCodeResponse:
        status = summarize_status(compile_result, run_result)
        return RunCodeResponse(status=status, message="" if status == RunStatus.Success else _message(compile_result, run_result),
                               compile_result=compile_result, run_result=run_result, files=files,
                               executor_pod_name=self.config.pod_name, queue_wait=queue_wait,
                               truncated=bool(reply.get("truncated")))

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        assert self.toolchains is not None, "Executor.start() first"
        job = {**self._limits(request.total_timeout), "mode": "jupyter", "cells": request.cells,
               "cell_timeout": request.cell_timeout, "files": {k: v or "" for k, v in request.files.items()},
               "fetch_files": request.fetch_files, "last": True}
        memory_mb = self.config.default_memory_mb
        flavor = self._flavor_for("\n".join(request.cells))
        slot, queue_wait = await self._acquire(flavor)
        try:
            reply = await slot.job(job, memory_mb, flavor)
        except SlotCrashed as exc:
            return RunJupyterResponse(status=RunStatus.SandboxError, message=f"sandbox slot failed: {exc}",
                                      executor_pod_name=self.config.pod_name, queue_wait=queue_wait)
        finally:
            self._release(slot)
        driver = _command_result(reply, memory_mb)
        cells = [CellRunResult(**cell) for cell in reply.get("cells", [])]
        if driver.status == CommandRunStatus.TimeLimitExceeded:
            message = f"total_timeout of {request.total_timeout:g} s exceeded after {len(cells)} of {len(request.cells)} cells"
            cells += [CellRunResult(error=[{"ename": "TimeoutError", "evalue": message, "traceback": []}])
                      for _ in range(len(request.cells) - len(cells))]
            status = RunStatus.Failed
        elif driver.status == CommandRunStatus.Error or driver.return_code != 0:
            message = f"the kernel died: {driver.stderr or driver.return_code}"
            status = RunStatus.Failed if driver.status != CommandRunStatus.Error else RunStatus.SandboxError
        else:
            message, status = "", RunStatus.Success
        return RunJupyterResponse(status=status, message=message, driver=driver, cells=cells,
                                  files=reply.get("files", {}), executor_pod_name=self.config.pod_name,
                                  queue_wait=queue_wait, truncated=bool(reply.get("truncated")))


def _command_result(reply: dict[str, Any], memory_mb: int) -> CommandRunResult:
    stderr = reply.get("stderr", "")
    if reply.get("oom_killed"):
        stderr += f"\n[verl-sf: killed: memory limit of {memory_mb} MB exceeded]\n"
    return CommandRunResult(status=CommandRunStatus(reply["status"]), execution_time=reply.get("execution_time"),
                            cpu_time=reply.get("cpu_time"), return_code=reply.get("return_code"),
                            stdout=reply.get("stdout", ""), stderr=stderr)


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
