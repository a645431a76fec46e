"""POST /get_observation: verl-tool's python_code tool, run by this server's executor.

A batch's entries run concurrently and wait for sandbox slots like any other request; one
entry's failure is its own observation, never the batch's.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from verl_sf.executor import Executor, Overloaded
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus
from verl_sf.server.app import EXECUTOR_KEY, METRICS_KEY, _parse
from verl_sf.server.metrics import ServerMetrics
from verl_sf.verl_tool.config import VerlToolConfig, VerlToolState
from verl_sf.verl_tool.parsing import (
    extract_code,
    extract_stdin,
    failure_observation,
    invalid_observation,
    run_output,
    wrap_observation,
)
from verl_sf.verl_tool.programs import PRE_IMPORT
from verl_sf.verl_tool.protocol import GetObservationRequest, GetObservationResponse, Step, StepOutcome
from verl_sf.verl_tool.sessions import ExecutorSessions
from verl_sf.verl_tool.state import ReplayTrajectories, SessionTrajectories, Trajectories

log = logging.getLogger(__name__)
ENDPOINT = "get_observation"


class PythonCodeTool:
    """verl-tool's `python_code` tool (plus its `finish` tool) over this server's sandboxes."""

    def __init__(self, config: VerlToolConfig, trajectories: Trajectories, metrics: ServerMetrics):
        self.config = config
        self.trajectories = trajectories
        self.metrics = metrics

    async def step(self, step: Step) -> StepOutcome:
        if step.finish:
            await self.trajectories.end(step.trajectory_id)
            return StepOutcome("", done=True, valid=True)
        try:
            return await self._act(step)
        except Overloaded as exc:
            self.metrics.rejections.labels("overloaded").inc()
            return StepOutcome(failure_observation(f"server overloaded: {exc}"), done=True, valid=False, refused=True)
        except Exception as exc:  # this entry's failure, reported in its own observation
            log.exception("verl-tool entry %d (trajectory %r) failed", step.index, step.trajectory_id)
            return StepOutcome(failure_observation(f"{type(exc).__name__}: {exc}"), done=True, valid=False)
        finally:
            if step.is_last_step:
                await self.trajectories.end(step.trajectory_id)

    async def _act(self, step: Step) -> StepOutcome:
        code = extract_code(step.action)
        if code is None:
            return StepOutcome(invalid_observation(), done=False, valid=False)
        started = time.monotonic()
        stdin = extract_stdin(step.action, step.extra_field.get("stdin"))
        turn = await self.trajectories.run_turn(step.trajectory_id, code, stdin)
        self._record(turn.response, started)
        run = turn.response.run_result
        # A time-out spent waiting for a CPU is the sandbox's failure too (and `dones` ends the trajectory).
        if turn.response.status == RunStatus.SandboxError or (run is not None and run.cpu_starved):
            reason = f"sandbox error: {turn.response.message or 'the run could not execute'}"
            return StepOutcome(failure_observation(reason), done=True, valid=False, ran=True)
        output = run_output(turn.response, self.config.run_timeout, self.config.max_observation_chars)
        if turn.lost_state:
            notice = f"[verl-sf: earlier turns' state is gone ({turn.lost_state}); this code ran from a clean start]"
            output = f"{notice}\n{output}"
        if turn.state_ended:
            notice = f"[verl-sf: the interpreter ended ({turn.state_ended}); the next turn starts from a clean state]"
            output = f"{output}\n{notice}" if output else notice
        return StepOutcome(wrap_observation(step.action, output), done=False, valid=True, ran=True)

    def _record(self, response: RunCodeResponse, started: float) -> None:
        self.metrics.runs.labels(ENDPOINT, "python", response.status.value).inc()
        self.metrics.latency.labels(ENDPOINT, "python").observe(time.monotonic() - started)
        if response.queue_wait is not None:
            self.metrics.queue_wait.observe(response.queue_wait)


VERL_TOOL_KEY = web.AppKey("verl_tool", PythonCodeTool)


async def get_observation(request: web.Request) -> web.Response:
    parsed = await _parse(request, GetObservationRequest)
    if isinstance(parsed, web.Response):
        return parsed
    started = time.monotonic()
    tool = request.app[VERL_TOOL_KEY]
    outcomes = await asyncio.gather(*(tool.step(step) for step in parsed.steps()))
    if any(outcome.refused for outcome in outcomes) and not any(outcome.ran for outcome in outcomes):
        # Nothing ran, so verl-tool's client may simply send the batch again.
        retry_after = str(request.app["retry_after_s"])
        return web.json_response({"detail": "server overloaded: no sandbox slot could be queued for this batch"},
                                 status=503, headers={"Retry-After": retry_after})
    body = GetObservationResponse(observations=[outcome.observation for outcome in outcomes],
                                  dones=[outcome.done for outcome in outcomes],
                                  valids=[outcome.valid for outcome in outcomes],
                                  processing_time_ms=(time.monotonic() - started) * 1000)
    return web.Response(body=body.model_dump_json(), content_type="application/json")


def add_verl_tool_routes(app: web.Application, config: VerlToolConfig) -> None:
    """POST /get_observation on an app that `build_app` has given its executor and metrics."""
    app[VERL_TOOL_KEY] = PythonCodeTool(config, _trajectories(config, app[EXECUTOR_KEY]), app[METRICS_KEY])
    app.router.add_post("/get_observation", get_observation)


def _trajectories(config: VerlToolConfig, executor: Executor) -> Trajectories:
    if config.state is VerlToolState.replay:
        return ReplayTrajectories(executor, config)
    setup = RunCodeRequest(code=PRE_IMPORT, language="python", run_timeout=config.run_timeout) \
        if config.pre_import else None
    return SessionTrajectories(executor, config, ExecutorSessions(executor, config.idle_ttl_s, setup))
