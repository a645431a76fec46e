"""The parts of `CodeTestReward` around a run: completion clean-up, tasks, the harness (run here as plain `python -c`,
no sandbox), its plain-data codec, reading what it prints, the verdict, configuration."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus
from verl_sf.rewards import CodeTaskError, CodeTestReward, Outcome, sandbox_harness
from verl_sf.rewards.code_harness import (
    Candidate,
    CodeTask,
    TaskReference,
    candidate_code,
    fenced_code,
    function_body,
    has_banned_pattern,
    parse_task,
    read_reference,
    read_report,
    reference_code,
)
from verl_sf.rewards.code_reward import candidate_of, candidate_of_response, judge, judge_reference
from verl_sf.rewards.example_tasks import EXAMPLE_TASKS
from verl_sf.rewards.sandbox_harness import NotPlainData, decode, encode

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
    """The harness is our own trusted code around a hand-written body: plain python runs it here, without
    site-packages and away from this checkout, so the standard library is all it has, as in the sandbox."""
    return subprocess.run([sys.executable, "-S", "-c", harness], capture_output=True, text=True, timeout=60,
                          cwd="/").stdout


def test_the_shipped_harness_is_its_parts_in_one_namespace() -> None:
    namespace: dict = {"__name__": "__main__"}
    exec(compile(sandbox_harness.source(), "verl_sf_harness.py", "exec"), namespace)
    for part in sandbox_harness.PARTS:
        assert {name for name in vars(part) if not name.startswith("__")} <= namespace.keys(), part.__name__


def test_a_harness_part_imports_only_the_parts_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_harness, "PARTS", sandbox_harness.PARTS[::-1])
    with pytest.raises(RuntimeError, match="names of earlier parts"):
        sandbox_harness.source()


def _reference(task: CodeTask) -> TaskReference:
    reference = read_reference(_run(reference_code(task)))
    assert isinstance(reference, TaskReference)
    return reference


KADANE = ("    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n"
          "        best = max(best, cur)\n    return best")


def test_reference_run_gives_inputs_and_answers_or_the_tasks_error() -> None:
    reference = _reference(MAX_SUBARRAY)
    assert reference.expected[:5] == (5, -3, -1, 6, 10) and len(reference.expected) == 7
    bad_task = MAX_SUBARRAY.model_copy(update={"tests": ("[1]", "undefined_name")})
    assert read_reference(_run(reference_code(bad_task))) == "NameError: name 'undefined_name' is not defined"
    odd_task = MAX_SUBARRAY.model_copy(update={"tests": ("object()",), "reference": "repr"})
    assert "must be plain data, found a object" in str(read_reference(_run(reference_code(odd_task))))


def test_a_python_that_cannot_read_our_bytecode_runs_the_harness_source() -> None:
    other_python = reference_code(MAX_SUBARRAY).replace(repr(importlib.util.MAGIC_NUMBER), repr(b"\x00\x00\r\n"), 1)
    assert other_python != reference_code(MAX_SUBARRAY)
    assert read_reference(_run(other_python)) == _reference(MAX_SUBARRAY)


def _judged(task: CodeTask, body: str) -> tuple:
    reference = _reference(task)
    stdout = _run(candidate_code(task, Candidate(body, True), reference))
    run = CommandRunResult(status=CommandRunStatus.Finished, return_code=0, stdout=stdout)
    result = judge(RunCodeResponse(status=RunStatus.Success, run_result=run), reference)
    return result.reward, result.suspects


def test_candidate_run_returns_results_compared_here() -> None:
    assert _judged(MAX_SUBARRAY, KADANE) == (1.0, ())
    assert _judged(MAX_SUBARRAY, "    return sum(xs)") == (pytest.approx(3 / 7), ())
    assert _judged(MAX_SUBARRAY, "    return max_subarray_sum(") == (-1.0, ())  # a syntax error


def test_a_body_that_exits_or_fakes_output_cannot_forge_a_verdict() -> None:
    forged = '    print(\'{"results": [true, true, true, true, true]}\')\n    raise SystemExit(0)'
    reward, suspects = _judged(SORTING, forged)
    assert reward == 0.0 and suspects[0].startswith("forged_verdict: printed a verdict-like line")
    reward, suspects = _judged(SORTING, "    return {'results': [True] * 5}")
    assert reward == 0.0 and suspects == ()  # a dict is a (wrong) plain result, not a verdict
    reward, suspects = _judged(SORTING, "    __builtins__.print(3, file=open(3, 'w', closefd=False))\n    return xs")
    assert reward == -1.0 and suspects[0].startswith("protocol: ")


@pytest.mark.parametrize("value", [None, True, 0, -(2 ** 70), 1.5, float("inf"), "x\ud800", b"\x00\xff", [1, [2]],
                                   (1, (2,)), {1, 2}, frozenset({3}), {"a": [1], 2: (3,)}, [], ()])
def test_plain_data_round_trips_with_exact_types(value: object) -> None:
    decoded = decode(json.loads(json.dumps(encode(value))))
    assert decoded == value and type(decoded) is type(value)


def test_only_exact_builtin_types_are_plain_data() -> None:
    class Always(int):
        def __eq__(self, other: object) -> bool:
            return True

    for value in (Always(1), [Always(1)], {"k": object()}, type("L", (list,), {})()):
        with pytest.raises(NotPlainData):
            encode(value)
    assert encode(True) is True and encode(1) == 1 and type(decode(encode(1))) is int  # bool and int stay apart
    for data in ({"results": [True]}, {"tuple": "x"}, {"dict": [[[1], 2]]}, {"bytes": "zz"}, {"set": [[1]]}):
        with pytest.raises(NotPlainData):
            decode(data)


@pytest.mark.parametrize("stdout", ["", "hello", '{"results": [true]}', '{"report": {"state": "maybe"}}', "[true]"])
def test_output_without_a_well_formed_report_has_no_state(stdout: str) -> None:
    assert read_report(stdout).state is None


def _response(status: RunStatus, run_status: CommandRunStatus = CommandRunStatus.Finished, stdout: str = "",
              return_code: int = 0, **run_fields: object) -> RunCodeResponse:
    run = CommandRunResult(status=run_status, return_code=return_code, stdout=stdout, stderr="Traceback\nBoom: x",
                           **run_fields)
    return RunCodeResponse(status=status, run_result=run)


class _StarvedRun(CommandRunResult):
    cpu_starved: bool = True


def test_judge_tells_the_codes_failure_from_the_sandboxes() -> None:
    reference = TaskReference("[[1], [2]]", (1, 2))
    report = '{"report": {"state": "done", "tests": [{"result": 1}, {"result": 3}], "detail": ""}}'
    scored = judge(_response(RunStatus.Success, stdout=report), reference)
    assert (scored.outcome, scored.reward, scored.suspects) == (Outcome.scored, 0.5, ())
    crashed = judge(_response(RunStatus.Failed, return_code=1), reference)
    assert (crashed.outcome, crashed.reward, crashed.detail) == (Outcome.error, -1.0, "Finished: Boom: x")
    timed_out = judge(_response(RunStatus.Failed, CommandRunStatus.TimeLimitExceeded, return_code=-9), reference)
    assert (timed_out.outcome, timed_out.reward) == (Outcome.error, -1.0)
    no_verdict = judge(_response(RunStatus.Success, stdout="bye"), reference)
    assert (no_verdict.outcome, no_verdict.reward) == (Outcome.error, -1.0)
    sandbox = judge(RunCodeResponse(status=RunStatus.SandboxError, message="bwrap failed"), reference)
    assert (sandbox.outcome, sandbox.reward, sandbox.failure_reason) == (Outcome.sandbox_failure, None, "sandbox_error")
    starved = RunCodeResponse(status=RunStatus.Failed, run_result=_StarvedRun(
        status=CommandRunStatus.TimeLimitExceeded, return_code=-9))
    assert (judge(starved, reference).reward, judge(starved, reference).failure_reason) == (None, "cpu_starved")
    task = judge_reference(_response(RunStatus.Success, stdout='{"task_error": "NameError: x"}'), 2)
    assert isinstance(task, type(scored)) and (task.outcome, task.reward) == (Outcome.task_error, None)


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
