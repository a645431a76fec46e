"""verl-tool's `python_code` tool (and its `finish`) over this server's executor: a batch of
/get_observation entries in, one outcome per entry out (the server installs the route).

A batch's entries run concurrently and wait for sandbox slots like any other request; one
entry's failure is its own observation, never the batch's.
"""

from __future__ import annotations

import asyncio
import logging
import time

from verl_sf.executor import Executor, Overloaded
from verl_sf.models import RunCodeRequest, RunStatus
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
from verl_sf.verl_tool.protocol import GetObservationRequest, Step, StepOutcome
from verl_sf.verl_tool.sessions import ExecutorSessions
from verl_sf.verl_tool.state import ReplayTrajectories, SessionTrajectories, Trajectories

log = logging.getLogger(__name__)


class PythonCodeTool:
    """verl-tool's `python_code` tool (plus its `finish` tool) over this server's sandboxes."""

    def __init__(self, config: VerlToolConfig, trajectories: Trajectories):
        self.config = config
        self.trajectories = trajectories

    async def observe(self, request: GetObservationRequest, namespace: str = "") -> list[StepOutcome]:
        """Every entry of the batch, side by side; outcomes in the request's order."""
        return list(await asyncio.gather(*(self.step(step) for step in request.steps(namespace))))

    async def step(self, step: Step) -> StepOutcome:
        if step.finish:
            await self.trajectories.end(step.key)
            return StepOutcome("", done=True, valid=True)
        try:
            return await self._act(step)
        except Overloaded as exc:
            return StepOutcome(failure_observation(f"server overloaded: {exc}"), done=True, valid=False, refused=True)
        except Exception as exc:  # this entry's failure, reported in its own observation
            log.exception("verl-tool entry %d (trajectory %r) failed", step.index, step.trajectory_id)
            return StepOutcome(failure_observation(f"{type(exc).__name__}: {exc}"), done=True, valid=False)
        finally:
            if step.is_last_step:
                await self.trajectories.end(step.key)

    async def _act(self, step: Step) -> StepOutcome:
        code = extract_code(step.action)
        if code is None:
            return StepOutcome(invalid_observation(), done=False, valid=False)
        started = time.monotonic()
        stdin = extract_stdin(step.action, step.extra_field.get("stdin"))
        turn = await self.trajectories.run_turn(step.key, code, stdin)
        response, seconds = turn.response, time.monotonic() - started
        run = response.run_result
        # A time-out spent waiting for a CPU is the sandbox's failure too (and `dones` ends the trajectory).
        if response.status == RunStatus.SandboxError or (run is not None and run.cpu_starved):
            reason = f"sandbox error: {response.message or 'the run could not execute'}"
            return StepOutcome(failure_observation(reason), done=True, valid=False, response=response, seconds=seconds)
        output = run_output(response, self.config.run_timeout, self.config.max_observation_chars)
        if turn.lost_state:
            notice = f"[verl-sf: earlier turns' state is gone ({turn.lost_state}); this code ran from a clean start]"
            output = f"{notice}\n{output}"
        if turn.state_ended:
            notice = f"[verl-sf: the interpreter ended ({turn.state_ended}); the next turn starts from a clean state]"
            output = f"{output}\n{notice}" if output else notice
        return StepOutcome(wrap_observation(step.action, output), done=False, valid=True, response=response,
                           seconds=seconds)


def build_tool(config: VerlToolConfig, executor: Executor) -> PythonCodeTool:
    """The tool with the trajectory state `config.state` asks for."""
    if config.state is VerlToolState.replay:
        return PythonCodeTool(config, ReplayTrajectories(executor, config))
    setup = RunCodeRequest(code=PRE_IMPORT, language="python", run_timeout=config.run_timeout) \
        if config.pre_import else None
    return PythonCodeTool(config, SessionTrajectories(executor, config, ExecutorSessions(executor, config.idle_ttl_s,
                                                                                          setup)))
