"""Stateless runs: a Sandbox Fusion request made one zygote job (jobs.py: an optional compile
stage, then the run), admitted, run in the smallest warm interpreter that has what the code
names, and its reply made the response (responses.py).  A sandbox's failure is a SandboxError,
never the code's."""

from __future__ import annotations

import time

from verl_sf.executor import jobs
from verl_sf.executor.admission import Admission
from verl_sf.executor.config import CELLS, ExecutorConfig
from verl_sf.executor.gpu_slots import NoGpuFree
from verl_sf.executor.languages import SPECS, SourceRejected, Toolchains
from verl_sf.executor.pool import STDLIB, ZygotePool
from verl_sf.executor.responses import ResponseContext, jupyter_response, run_response
from verl_sf.executor.status import ExecutorStats
from verl_sf.executor.zygote_process import SandboxCrashed
from verl_sf.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)


class Runs:
    def __init__(self, config: ExecutorConfig, stats: ExecutorStats, admission: Admission, pool: ZygotePool,
                 toolchains: Toolchains):
        self.config = config
        self.stats = stats
        self._admission = admission
        self._pool = pool
        self._toolchains = toolchains

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        arrived = time.monotonic()
        spec, toolchains, pod = SPECS[request.language], self._toolchains, self.config.pod_name
        if request.language in toolchains.missing:
            return RunCodeResponse(status=RunStatus.SandboxError, message=toolchains.missing_message(request.language),
                                   executor_pod_name=pod)
        try:
            source = spec.prepare_source(request.code)
        except SourceRejected as exc:
            rejected = CommandRunResult(status=CommandRunStatus.Finished, return_code=1, stdout="", stderr=str(exc))
            return RunCodeResponse(status=RunStatus.Failed, message="compilation failed", compile_result=rejected,
                                   executor_pod_name=pod)
        memory_mb = self.config.memory_mb(request.memory_limit_MB)
        fast = request.language == "python" and self.config.fast_path
        job = jobs.run_job(request, source, toolchains.argv(spec.run, source.params),
                           toolchains.argv(spec.compile, source.params) if spec.compile else None,
                           self.config, memory_mb, fast)
        try:
            reply, queue_wait = await self._admission.run(
                self._pool, await self._pool.flavor_for(request.code) if fast else STDLIB, job, arrived, gpu=spec.gpu)
        except SandboxCrashed as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=f"sandbox failed: {exc}",
                                   run_result=CommandRunResult(status=CommandRunStatus.Error), executor_pod_name=pod)
        except NoGpuFree as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=str(exc), executor_pod_name=pod)
        response = run_response(reply, bool(spec.compile), ResponseContext.of(self.config, memory_mb, queue_wait))
        self.stats.count(response)
        return response

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        arrived = time.monotonic()
        memory_mb = self.config.default_memory_mb
        job = jobs.jupyter_job(request, self.config, memory_mb)
        try:
            reply, queue_wait = await self._admission.run(
                self._pool, await self._pool.flavor_for("\n".join(request.cells)) + CELLS, job, arrived)
        except SandboxCrashed as exc:
            return RunJupyterResponse(status=RunStatus.SandboxError, message=f"sandbox failed: {exc}",
                                      executor_pod_name=self.config.pod_name)
        response = jupyter_response(reply, len(request.cells), request.total_timeout,
                                    ResponseContext.of(self.config, memory_mb, queue_wait))
        self.stats.count(response)
        return response
