"""A request turned into a zygote job: its head (what the zygote acts on) and its body (what the
child reads), typed as the zygote's messages say.  Pure: no sandbox needed to test it."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.languages import PreparedSource
from verl_sf.executor.zygote.messages import (
    Limits,
    RunBody,
    RunHead,
    SessionCallBody,
    SessionCallHead,
    SessionForkHead,
    SessionLanguage,
    SessionOpenHead,
)
from verl_sf.models import RunCodeRequest, RunJupyterRequest
from verl_sf.off_loop import base64_of

CLIENT_SLACK_S = 10.0  # verl's reward client waits run_timeout + compile_timeout + this
SESSION_OPEN_TIMEOUT_S = 30.0
_ids = itertools.count(1)


def next_id() -> int:
    """Request ids, unique in this server: replies are matched to requests by them."""
    return next(_ids)


@dataclasses.dataclass
class JobRequest:
    """A run as the server sends it to a zygote (the zygote's side of it is zygote/job.py's `Job`)."""

    head: RunHead
    body: RunBody


def limits(config: ExecutorConfig, timeout: float, budget: float, memory_mb: int) -> Limits:
    """`budget`: what the client waits in all; the reply must leave `reply_margin_s` before it.
    `hard_timeout` counts from the request's arrival until `hand_over` makes it count from then."""
    return {"timeout": timeout, "hard_timeout": budget - config.reply_margin_s,
            "output_limit": config.output_limit_bytes, "memory": memory_mb << 20, "nproc": config.max_processes}


def hand_over(job_limits: Limits, waited: float) -> None:
    """Just before the zygote gets the job: the time it waited (for a slot, a busy session) comes
    off its hard limit, so the reply still leaves before the client's deadline."""
    job_limits["hard_timeout"] = max(job_limits["hard_timeout"] - waited, job_limits["timeout"])


def hold_exit(job: JobRequest, hold: bool) -> None:
    """Whether the run's PID 1 hands its exit to the zygote (exits.py), in both halves of the job."""
    job.head["hold_exit"] = job.body["hold_exit"] = hold


def body_limits(config: ExecutorConfig, memory_mb: int) -> RunBody:
    return {"fsize": config.max_file_size_mb << 20, "nofile": config.max_open_files, "nproc": config.max_processes,
            "memory": memory_mb << 20, "output_limit": config.output_limit_bytes}


def run_job(request: RunCodeRequest, source: PreparedSource, argv: list[str], compile_argv: Optional[list[str]],
            config: ExecutorConfig, memory_mb: int, fast_path: bool) -> JobRequest:
    """`fast_path`: python code run in the forked interpreter itself rather than exec'd."""
    written = source.extra_files if fast_path else {source.filename: source.code, **source.extra_files}
    files = {**{k: v or "" for k, v in request.files.items()},
             **{name: base64_of(text.encode()) for name, text in written.items()}}
    body: RunBody = {**body_limits(config, memory_mb), "stdin": request.stdin, "fetch_files": request.fetch_files,
                     "files": files}
    if fast_path:  # the forked interpreter runs the code itself: no file of it
        body["mode"], body["code"] = "python", request.code
        files.pop(source.filename, None)
    else:
        body["mode"], body["argv"] = "exec", argv
        if compile_argv:
            body["compile_argv"] = compile_argv
    budget = request.run_timeout + request.compile_timeout + CLIENT_SLACK_S
    head: RunHead = {"op": "run", "id": next_id(), "exec": not fast_path, "hold_exit": False,
                     "compile_timeout": request.compile_timeout if compile_argv else 0,
                     "limits": limits(config, request.run_timeout, budget, memory_mb)}
    return JobRequest(head, body)


def jupyter_job(request: RunJupyterRequest, config: ExecutorConfig, memory_mb: int) -> JobRequest:
    body: RunBody = {**body_limits(config, memory_mb), "mode": "jupyter", "cells": request.cells,
                     "cell_timeout": request.cell_timeout, "files": {k: v or "" for k, v in request.files.items()},
                     "fetch_files": request.fetch_files}
    head: RunHead = {"op": "run", "id": next_id(), "compile_timeout": 0, "exec": False, "hold_exit": False,
                     "limits": limits(config, request.total_timeout, request.total_timeout + CLIENT_SLACK_S, memory_mb)}
    job = JobRequest(head, body)
    hold_exit(job, True)  # its PID 1 runs the cells: answered before the teardown of what they wrote
    return job


def session_open(language: SessionLanguage, files: dict[str, Optional[str]], config: ExecutorConfig,
                 memory_mb: int, rooted: bool = False) -> tuple[SessionOpenHead, RunBody]:
    body: RunBody = {**body_limits(config, memory_mb),
                     "mode": "session_python" if language == "python" else "session_bash",
                     "files": {k: v or "" for k, v in files.items()}}
    head: SessionOpenHead = {"op": "open", "id": next_id(), "language": language, "rooted": rooted,
                             "limits": limits(config, SESSION_OPEN_TIMEOUT_S, SESSION_OPEN_TIMEOUT_S, memory_mb)}
    return head, body


def session_fork(open_id: int, count: int, config: ExecutorConfig, memory_mb: int,
                 freeze: bool, files_budget: int) -> SessionForkHead:
    return {"op": "fork", "id": next_id(), "session": open_id, "ids": [next_id() for _ in range(count)],
            "limits": limits(config, SESSION_OPEN_TIMEOUT_S, SESSION_OPEN_TIMEOUT_S, memory_mb), "freeze": freeze,
            "files_budget": files_budget}


def session_call(open_id: int, timeout: float, config: ExecutorConfig, memory_mb: int) -> SessionCallHead:
    return {"op": "call", "id": next_id(), "session": open_id, "grace": config.session_interrupt_grace_s,
            "limits": limits(config, timeout, timeout + CLIENT_SLACK_S, memory_mb)}


def code_call(request: RunCodeRequest, config: ExecutorConfig) -> SessionCallBody:
    return {"code": request.code, "stdin": request.stdin, "output_limit": config.output_limit_bytes,
            "fetch_files": request.fetch_files or None}


def cells_call(request: RunJupyterRequest, config: ExecutorConfig) -> SessionCallBody:
    return {"cells": request.cells, "cell_timeout": request.cell_timeout, "output_limit": config.output_limit_bytes,
            "fetch_files": request.fetch_files or None}
