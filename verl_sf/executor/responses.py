"""A zygote's reply turned into the Sandbox Fusion response: pure functions of the reply, the
request's shape and the server's settings (unit-tested without a sandbox)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, TypeVar, Union

from pydantic import ValidationError

from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.zygote.messages import Outcome, StageResult
from verl_sf.models import (
    CellRunResult,
    CommandRunResult,
    CommandRunStatus,
    RunCodeResponse,
    RunJupyterResponse,
    RunStatus,
    summarize_status,
)


@dataclasses.dataclass(frozen=True)
class ResponseContext:
    pod_name: str
    runs_memory_mb: int  # the cap over all runs and sessions, named when a kill was for it
    memory_mb: int  # the job's own cap
    queue_wait: float = 0.0
    session_id: Optional[str] = None

    @classmethod
    def of(cls, config: ExecutorConfig, memory_mb: int, queue_wait: float = 0.0,
           session_id: Optional[str] = None) -> ResponseContext:
        return cls(config.pod_name, config.runs_memory_mb, memory_mb, queue_wait, session_id)


def command_result(stage: StageResult, context: ResponseContext) -> CommandRunResult:
    stderr = stage.get("stderr", "")
    if stage.get("memory_exceeded"):
        if stage.get("memory_scope") == "shared":
            stderr += (f"\n[verl-sf: killed for memory: the runs and sessions of this server together reached "
                       f"its cap of {context.runs_memory_mb} MB (--runs-memory-mb); this run was within "
                       f"its own limit of {context.memory_mb} MB]\n")
        else:
            stderr += f"\n[verl-sf: killed: memory limit of {context.memory_mb} MB exceeded]\n"
    return CommandRunResult(status=CommandRunStatus(stage.get("status", "Error")),
                            execution_time=stage.get("execution_time"), cpu_time=stage.get("cpu_time"),
                            cpu_wait_time=stage.get("cpu_wait_time"), cpu_starved=bool(stage.get("cpu_starved")),
                            return_code=stage.get("return_code"), stdout=stage.get("stdout", ""), stderr=stderr)


def run_response(reply: Outcome, compiled: bool, context: ResponseContext) -> RunCodeResponse:
    """`compiled`: the language has a compile stage, whose result the reply carries apart."""
    if reply["kind"] == "failed":
        return RunCodeResponse(status=RunStatus.SandboxError, message=reply["error"],
                               executor_pod_name=context.pod_name, queue_wait=context.queue_wait,
                               session_id=context.session_id)
    compile_result = run_result = None
    if compiled and reply["kind"] == "run" and "compile" in reply:
        compile_result = command_result(reply["compile"], context)
        if compile_result.return_code == 0:
            run_result = command_result(reply, context)
    elif compiled:
        compile_result = command_result(reply, context)  # the compile stage itself timed out or died
    else:
        run_result = command_result(reply, context)
    status = summarize_status(compile_result, run_result)
    message = "" if status == RunStatus.Success else _message(compile_result, run_result)
    if run_result is not None and run_result.cpu_starved:
        # Still Sandbox Fusion's Failed + TimeLimitExceeded (what its clients score as a time-out);
        # the field tells verl-sf's tool and rewards that the code is not to blame.
        message = "run_timeout exceeded while the run mostly waited for a CPU (server overloaded)"
    return RunCodeResponse(status=status, message=message, compile_result=compile_result, run_result=run_result,
                           files=run_files(reply), executor_pod_name=context.pod_name,
                           queue_wait=context.queue_wait, truncated=bool(reply.get("truncated")),
                           session_id=context.session_id)


# A run's records (its fetched files, its cells) are written by its own child, where its code can
# write in their place: what is not of their shape is the code's doing, never a server error.
MALFORMED_CELL = "the cell's record is not one the sandbox writes: the run's own code wrote it"


def run_files(reply: Outcome) -> dict[str, str]:
    """The fetched files the run reported: name -> base64 pairs, nothing else."""
    files: Any = reply.get("files")
    if not isinstance(files, dict):
        return {}
    return {name: data for name, data in files.items() if isinstance(name, str) and isinstance(data, str)}


def _cell(record: Any) -> CellRunResult:
    try:
        return CellRunResult.model_validate(record)
    except ValidationError:
        return CellRunResult(error=[{"ename": "ValueError", "evalue": MALFORMED_CELL, "traceback": []}])


def jupyter_response(reply: Outcome, n_cells: int, timeout: float, context: ResponseContext) -> RunJupyterResponse:
    if reply["kind"] == "failed":
        return RunJupyterResponse(status=RunStatus.SandboxError, message=reply["error"],
                                  executor_pod_name=context.pod_name, queue_wait=context.queue_wait,
                                  session_id=context.session_id)
    driver = command_result(reply, context)
    # One per cell sent, at most: more can only come from the run's own code (a forked copy writing records).
    cells = [_cell(record) for record in reply.get("cells", [])[:n_cells]]
    if driver.status == CommandRunStatus.TimeLimitExceeded:
        message = f"total_timeout of {timeout:g} s exceeded after {len(cells)} of {n_cells} cells"
        cells += [CellRunResult(error=[{"ename": "TimeoutError", "evalue": message, "traceback": []}])
                  for _ in range(n_cells - len(cells))]
        status = RunStatus.Failed
    elif driver.status == CommandRunStatus.Error or driver.return_code != 0:
        why = (driver.stderr or "").strip() or (f"exit code {driver.return_code}" if driver.return_code is not None
                                        else "killed")
        message = f"the kernel died: {why}"
        status = RunStatus.Failed if driver.status != CommandRunStatus.Error else RunStatus.SandboxError
    else:
        message, status = "", RunStatus.Success
    return RunJupyterResponse(status=status, message=message, driver=driver, cells=cells,
                              files=run_files(reply), executor_pod_name=context.pod_name,
                              queue_wait=context.queue_wait, truncated=bool(reply.get("truncated")),
                              session_id=context.session_id)


FAILED_CALL = "the sandbox failed the call, so the session was closed"
Response = TypeVar("Response", bound=Union[RunCodeResponse, RunJupyterResponse])


def note_session_end(response: Response, reply: Outcome) -> Response:
    """A call that ended its session says so (killed at its time-out, for memory, by exit)."""
    response.session_alive = reply["kind"] == "call" and reply["session_alive"]
    if not response.session_alive:
        why = reply.get("session_end", "its interpreter exited") if reply["kind"] == "call" else FAILED_CALL
        note = f"the session ended: {why}"
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
    if run_result.return_code is None:
        return "killed before it exited"
    return f"exited with return code {run_result.return_code}"
