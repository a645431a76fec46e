"""The executor's pure halves: a zygote's reply made a Sandbox Fusion response (responses.py), and a
request made a zygote job (jobs.py).  No sandbox: the replies are the zygote's wire shapes."""

from __future__ import annotations

from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.jobs import CLIENT_SLACK_S, hand_over, jupyter_job, limits, run_job
from verl_sf.executor.languages import PreparedSource
from verl_sf.executor.responses import ResponseContext, jupyter_response, note_session_end, run_response
from verl_sf.executor.zygote.messages import CallReply, RunReply
from verl_sf.models import CommandRunStatus, RunCodeRequest, RunJupyterRequest, RunStatus

CONTEXT = ResponseContext(pod_name="pod", runs_memory_mb=8000, memory_mb=256, queue_wait=0.25, session_id="s1")


def test_a_finished_run_is_a_success_with_its_output() -> None:
    reply: RunReply = {"kind": "run", "id": 1, "status": "Finished", "return_code": 0, "stdout": "42\n", "stderr": "",
                       "execution_time": 0.01}
    response = run_response(reply, compiled=False, context=CONTEXT)
    assert response.status == RunStatus.Success and response.message == ""
    assert response.run_result is not None and response.run_result.stdout == "42\n"
    assert response.compile_result is None and response.queue_wait == 0.25 and response.session_id == "s1"


def test_a_reply_the_zygote_could_not_make_is_a_sandbox_error_never_the_code_s() -> None:
    response = run_response({"kind": "failed", "id": 1, "error": "could not fork"}, compiled=False, context=CONTEXT)
    assert response.status == RunStatus.SandboxError and response.message == "could not fork"
    assert response.run_result is None


def test_memory_kills_name_whose_cap_it_was() -> None:
    own: RunReply = {"kind": "run", "id": 1, "status": "Finished", "return_code": -9, "stderr": "",
                     "memory_exceeded": True, "memory_scope": "own"}
    shared: RunReply = {**own, "memory_scope": "shared"}
    own_result = run_response(own, compiled=False, context=CONTEXT).run_result
    shared_result = run_response(shared, compiled=False, context=CONTEXT).run_result
    assert own_result is not None and "memory limit of 256 MB exceeded" in own_result.stderr
    assert shared_result is not None and "cap of 8000 MB (--runs-memory-mb)" in shared_result.stderr


def test_a_failed_compile_runs_nothing_and_says_so() -> None:
    reply: RunReply = {"kind": "run", "id": 1, "compile": {"status": "Finished", "return_code": 1, "stderr": "error: x"}}
    response = run_response(reply, compiled=True, context=CONTEXT)
    assert response.status == RunStatus.Failed and response.message == "compilation failed"
    assert response.run_result is None and response.compile_result is not None


def test_a_starved_time_out_is_scored_as_a_time_out_and_says_the_server_was_to_blame() -> None:
    reply: RunReply = {"kind": "run", "id": 1, "status": "TimeLimitExceeded", "return_code": None, "cpu_starved": True}
    response = run_response(reply, compiled=False, context=CONTEXT)
    assert response.status == RunStatus.Failed and "waited for a CPU" in response.message
    assert response.run_result is not None and response.run_result.status == CommandRunStatus.TimeLimitExceeded


def test_cells_past_the_total_timeout_each_get_a_timeout_error() -> None:
    reply: RunReply = {"kind": "run", "id": 1, "status": "TimeLimitExceeded", "return_code": None,
                       "cells": [{"kind": "cell", "stdout": "1\n", "stderr": "", "display": [], "error": [],
                                  "truncated": False}]}
    response = jupyter_response(reply, n_cells=3, timeout=2.0, context=CONTEXT)
    assert response.status == RunStatus.Failed and "after 1 of 3 cells" in response.message
    assert [cell.error[0]["ename"] if cell.error else None for cell in response.cells] == \
        [None, "TimeoutError", "TimeoutError"]


def test_a_session_call_says_when_its_session_ended() -> None:
    ended_call: CallReply = {"kind": "call", "id": 1, "status": "Finished", "return_code": 0, "session_alive": False,
                             "session_end": "killed for memory"}
    ended = note_session_end(run_response(ended_call, False, CONTEXT), ended_call)
    assert ended.session_alive is False and ended.message == "the session ended: killed for memory"
    interrupted: CallReply = {"kind": "call", "id": 1, "status": "TimeLimitExceeded", "return_code": None,
                              "session_alive": True}
    lives = note_session_end(run_response(interrupted, False, CONTEXT), interrupted)
    assert lives.session_alive and lives.message.endswith("the call was interrupted and the session lives on")


def test_a_session_call_the_sandbox_failed_is_a_sandbox_error_that_ends_the_session() -> None:
    failed = note_session_end(run_response({"kind": "failed", "id": 1, "error": "zygote error"}, False, CONTEXT),
                              {"kind": "failed", "id": 1, "error": "zygote error"})
    assert failed.status == RunStatus.SandboxError and failed.session_alive is False
    assert failed.message == "zygote error; the session ended: the sandbox failed the call, so the session was closed"


def test_a_job_s_hard_limit_leaves_the_reply_time_before_the_client_gives_up() -> None:
    config = ExecutorConfig()
    job_limits = limits(config, timeout=5.0, budget=5.0 + CLIENT_SLACK_S, memory_mb=256)
    assert job_limits["hard_timeout"] == 5.0 + CLIENT_SLACK_S - config.reply_margin_s
    hand_over(job_limits, waited=3.0)
    assert job_limits["hard_timeout"] == 5.0 + CLIENT_SLACK_S - config.reply_margin_s - 3.0
    hand_over(job_limits, waited=100.0)
    assert job_limits["hard_timeout"] == 5.0, "never below the run's own time-out"


def test_run_and_cells_jobs_carry_what_the_child_needs() -> None:
    config = ExecutorConfig()
    request = RunCodeRequest(code="print(1)", language="python", run_timeout=3, stdin="x",
                             files={"data.txt": "ZGF0YQ=="})
    fast = run_job(request, PreparedSource("main.py", "print(1)"), ["python3", "main.py"], None, config, 128,
                   fast_path=True)
    assert fast.head["exec"] is False and fast.body["mode"] == "python" and fast.body["code"] == "print(1)"
    assert fast.body["files"] == {"data.txt": "ZGF0YQ=="} and fast.body["stdin"] == "x"
    slow = run_job(request, PreparedSource("main.py", "print(1)"), ["python3", "main.py"], None, config, 128,
                   fast_path=False)
    assert slow.head["exec"] is True and slow.body["argv"] == ["python3", "main.py"] and "main.py" in slow.body["files"]
    assert slow.head["id"] != fast.head["id"]
    cells = jupyter_job(RunJupyterRequest(cells=["1", "2"], total_timeout=7), config, 128)
    assert cells.body["mode"] == "jupyter" and cells.body["cells"] == ["1", "2"]
    assert cells.head["limits"]["timeout"] == 7
