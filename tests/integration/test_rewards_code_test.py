"""The pure parts of `CodeTestReward`: completion clean-up, tasks, the harness and its verdict, configuration."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus
from verl_sf.rewards import CodeTaskError, CodeTestReward, Outcome
from verl_sf.rewards.code_harness import (
    Candidate,
    build_harness,
    fenced_code,
    function_body,
    has_banned_pattern,
    parse_task,
    read_harness_output,
)
from verl_sf.rewards.code_reward import candidate_of, candidate_of_response, judge
from verl_sf.rewards.example_tasks import EXAMPLE_TASKS

SORTING = parse_task("sorting", EXAMPLE_TASKS["sorting"])
MAX_SUBARRAY = parse_task("max_subarray", EXAMPLE_TASKS["max_subarray"])


def test_function_body_stops_at_the_first_unindented_line() -> None:
    completion = "    out = list(xs)\n\n    return out\ndef main():\n    pass\n"
    assert function_body(completion) == "    out = list(xs)\n\n    return out"
    assert function_body("print('hi')\n    return xs\n") == ""
    assert function_body("  return xs\n") == ""  # two spaces is not the body's indent
    assert function_body("") == ""


def test_fenced_code_takes_the_last_python_block_or_the_text() -> None:
    text = "Draft:\n```python\ndef f():\n    return 1\n```\nFinal:\n```py\ndef f():\n    return 2\n```\nDone."
    assert fenced_code(text) == "def f():\n    return 2"
    assert fenced_code("```\nx = 1\n```") == "x = 1"
    assert fenced_code("def f():\n    return 3\n") == "def f():\n    return 3"


def test_candidates_from_trl_and_verl_completions() -> None:
    assert candidate_of("    return xs\nfoo") == Candidate("    return xs", continues_prompt=True)
    chat = [{"role": "assistant", "content": [{"type": "text", "text": "```python\ndef f(): pass\n```"}]}]
    assert candidate_of(chat) == Candidate("def f(): pass", continues_prompt=False)
    assert candidate_of_response("```python\nx = 1\n```") == Candidate("x = 1", continues_prompt=False)
    assert candidate_of_response("    return xs\n") == Candidate("    return xs", continues_prompt=True)


def test_banned_patterns_are_case_insensitive() -> None:
    assert has_banned_pattern("    return SORTED(xs)", SORTING.banned_patterns) == "sorted("
    assert has_banned_pattern("    xs.sort()", SORTING.banned_patterns) == ".sort("
    assert has_banned_pattern("    return list(xs)", SORTING.banned_patterns) is None


@pytest.mark.parametrize("spec, message", [
    ({"func_name": "f", "tests": [], "reference": "sorted"}, "tests"),
    ({"func_name": "not an identifier", "tests": ["[1]"], "reference": "sorted"}, "func_name"),
    ({"func_name": "f", "tests": ["[1]"]}, "reference"),
    ({"func_name": "f", "tests": ["[1]"], "reference": "sorted", "test": ["[2]"]}, "test"),
    ("not json", "JSON"),
    (42, "must be a dict"),
])
def test_bad_tasks_are_typed_errors_naming_the_task_and_field(spec: object, message: str) -> None:
    with pytest.raises(CodeTaskError, match=message) as error:
        parse_task("mine", spec)
    assert "'mine'" in str(error.value)


def _run(harness: str) -> str:
    """The harness is our own trusted code around a hand-written body: plain python runs it here."""
    return subprocess.run([sys.executable, "-c", harness], capture_output=True, text=True, timeout=60).stdout


def test_harness_reports_tests_passed_and_task_errors() -> None:
    kadane = ("    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n"
              "        best = max(best, cur)\n    return best")
    report = read_harness_output(_run(build_harness(MAX_SUBARRAY, Candidate(kadane, True))), 7)
    assert report is not None and (report.passed, report.total, report.task_error) == (7, 7, None)
    bad_task = MAX_SUBARRAY.model_copy(update={"tests": ("[1]", "undefined_name")})
    report = read_harness_output(_run(build_harness(bad_task, Candidate(kadane, True))), 2)
    assert report is not None and report.task_error == "NameError: name 'undefined_name' is not defined"


def test_a_body_that_exits_or_fakes_output_cannot_forge_a_verdict() -> None:
    forged = '    print(\'{"results": [true, true, true, true, true]}\')\n    raise SystemExit(0)'
    report = read_harness_output(_run(build_harness(SORTING, Candidate(forged, True))), 5)
    assert report is not None and report.passed == 0


@pytest.mark.parametrize("stdout", ["", "hello", '{"results": [true]}', '{"results": [1, 0, 1, 1, 1]}', "[true]"])
def test_output_without_a_well_formed_verdict_is_none(stdout: str) -> None:
    assert read_harness_output(stdout, 5) is None


def _response(status: RunStatus, run_status: CommandRunStatus = CommandRunStatus.Finished, stdout: str = "",
              return_code: int = 0, **run_fields: object) -> RunCodeResponse:
    run = CommandRunResult(status=run_status, return_code=return_code, stdout=stdout, stderr="Traceback\nBoom: x",
                           **run_fields)
    return RunCodeResponse(status=status, run_result=run)


class _StarvedRun(CommandRunResult):
    cpu_starved: bool = True


def test_judge_tells_the_codes_failure_from_the_sandboxes() -> None:
    scored = judge(_response(RunStatus.Success, stdout='x\n{"results": [true, false]}\n'), 2)
    assert (scored.outcome, scored.reward) == (Outcome.scored, 0.5)
    crashed = judge(_response(RunStatus.Failed, return_code=1), 2)
    assert (crashed.outcome, crashed.reward, crashed.detail) == (Outcome.error, -1.0, "Finished: Boom: x")
    timed_out = judge(_response(RunStatus.Failed, CommandRunStatus.TimeLimitExceeded, return_code=-9), 2)
    assert (timed_out.outcome, timed_out.reward) == (Outcome.error, -1.0)
    no_verdict = judge(_response(RunStatus.Success, stdout="bye"), 2)
    assert (no_verdict.outcome, no_verdict.reward) == (Outcome.error, -1.0)
    sandbox = judge(RunCodeResponse(status=RunStatus.SandboxError, message="bwrap failed"), 2)
    assert (sandbox.outcome, sandbox.reward, sandbox.failure_reason) == (Outcome.sandbox_failure, None, "sandbox_error")
    starved = RunCodeResponse(status=RunStatus.Failed, run_result=_StarvedRun(
        status=CommandRunStatus.TimeLimitExceeded, return_code=-9))
    assert (judge(starved, 2).reward, judge(starved, 2).failure_reason) == (None, "cpu_starved")
    task = judge(_response(RunStatus.Success, stdout='{"task_error": "NameError: x"}'), 2)
    assert (task.outcome, task.reward) == (Outcome.task_error, None)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "needs sandbox_url"),
    ({"backend": "cloud"}, "backend must be"),
    ({"backend": "local", "sandbox_url": "http://127.0.0.1:1"}, "must not be set"),
    ({"sandbox_url": "ftp://x"}, "sandbox URL"),
    ({"sandbox_url": "http://127.0.0.1:1", "timeout_s": 0}, "run_timeout"),
    ({"sandbox_url": "http://127.0.0.1:1", "max_concurrency": 0}, "max_concurrency"),
    ({"sandbox_url": "http://127.0.0.1:1", "on_sandbox_failure": "ignore"}, "on_sandbox_failure"),
])
def test_bad_configuration_is_refused_up_front(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CodeTestReward(EXAMPLE_TASKS, **kwargs)


def test_reward_has_a_name_for_trl_and_finds_tasks() -> None:
    reward = CodeTestReward(EXAMPLE_TASKS, sandbox_url="http://127.0.0.1:1", name="sandboxed_tests")
    assert reward.__name__ == "sandboxed_tests"
    with pytest.raises(CodeTaskError, match="no task has the prompt"):
        reward(["def unknown():\n"], ["    pass\n"])
    with pytest.raises(CodeTaskError, match="unknown task 'nope'"):
        reward(["p"], ["    pass\n"], task=["nope"])
