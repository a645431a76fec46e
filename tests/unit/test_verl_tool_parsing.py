"""verl-tool's python_code formats, as pure functions: action parsing, observation text, programs, the request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus
from verl_sf.verl_tool.config import VerlToolConfig
from verl_sf.verl_tool.parsing import (
    extract_code,
    extract_stdin,
    failure_observation,
    invalid_observation,
    render_output,
    run_output,
    wrap_observation,
)
from verl_sf.verl_tool.programs import build_program
from verl_sf.verl_tool.protocol import GetObservationRequest

# The action of verl-tool's own tool-server docs, and the observation they show for it.
DOCS_ACTION = "```<python>\nprint('Hello from Python!')</python> ... <python>print('Hello again!')</python>``` ..."
DOCS_OBSERVATION = "\n<result>\nHello from Python!\nHello again!\n</result>\n"


@pytest.mark.parametrize("action, code", [
    ("<python>print('Hello from Python!')</python> ...", "print('Hello from Python!')"),
    ("```python\nprint('Hello from Python!')\n``` ...", "print('Hello from Python!')"),
    ("```\npython\nx = 1\n```", "x = 1"),
    ("```py\nx = 1\n```", "x = 1"),
    (DOCS_ACTION, "print('Hello from Python!')\nprint('Hello again!')"),
    ("first\n```python\na = 1\n```\nthen\n```python\nprint(a)\n```\n```output", "a = 1\nprint(a)"),
    ("<python>\n</python>", ""),
])
def test_code_comes_from_every_block_of_the_first_syntax_found(action: str, code: str) -> None:
    assert extract_code(action) == code


def test_python_tags_win_over_fenced_blocks() -> None:
    assert extract_code("```python\nfenced = 1\n```\n<python>tagged = 1</python>") == "tagged = 1"


def test_fenced_python_wins_over_fenced_py() -> None:
    assert extract_code("```py\nshort = 1\n```\n```python\nlong = 1\n```") == "long = 1"


@pytest.mark.parametrize("action", ["", "The answer is 42.", "```\nprint(1)\n```", "<python>print(1)",
                                    "```bash\nls\n```"])
def test_an_action_without_code_has_none(action: str) -> None:
    assert extract_code(action) is None


def test_an_input_block_overrides_the_requests_stdin() -> None:
    action = "```python\nprint(input())\n```\n```input\n 7 \n```"
    assert extract_stdin(action, "from extra_fields") == "7"
    assert extract_stdin("<python>print(input())</python>", "from extra_fields") == "from extra_fields"
    assert extract_stdin("<python>1</python>", None) is None


def test_output_is_stdout_a_newline_then_stderr_trimmed() -> None:
    assert render_output("4\n", "", False, 10, 100_000) == "4"
    assert render_output("partial\n", "Traceback ...\nValueError: x\n", False, 10, 100_000) == \
        "partial\n\nTraceback ...\nValueError: x"
    assert render_output("", "only stderr\n", False, 10, 100_000) == "only stderr"
    assert render_output("", "", False, 10, 100_000) == ""


def test_a_time_out_is_said_in_verl_tools_words() -> None:
    assert render_output("", "", True, 10.0, 100_000) == "Execution timed out after 10 seconds."
    assert render_output("started\n", "", True, 2.5, 100_000) == "started\n\nExecution timed out after 2.5 seconds."


def test_a_sessions_interrupt_at_the_time_out_is_not_shown_as_the_codes_error() -> None:
    interrupt = 'Traceback (most recent call last):\n  File "/workdir/main.py", line 2, in <module>\n' \
                "    time.sleep(30)\nKeyboardInterrupt\n"
    assert render_output("started\n", interrupt, True, 10, 100_000) == \
        "started\n\nExecution timed out after 10 seconds."
    assert render_output("", "KeyboardInterrupt\n" + interrupt, True, 10, 100_000) == \
        "KeyboardInterrupt\nExecution timed out after 10 seconds."  # only the trailing traceback is the server's
    # The code's own KeyboardInterrupt, when the run did not time out, stays.
    assert render_output("", interrupt, False, 10, 100_000).endswith("KeyboardInterrupt")


def test_tracebacks_name_the_file_as_the_code_knows_it() -> None:
    stderr = 'Traceback (most recent call last):\n  File "/workdir/main.py", line 2, in <module>\nNameError: x\n'
    assert render_output("", stderr, False, 10, 100_000) == \
        'Traceback (most recent call last):\n  File "main.py", line 2, in <module>\nNameError: x'


def test_output_is_cut_to_the_observation_limit() -> None:
    assert render_output("x" * 150_000, "", False, 10, 100_000) == "x" * 100_000
    assert render_output("x" * (68 * 1024), "", False, 10, 100_000) == "x" * (68 * 1024)


def test_run_output_reads_the_run_result() -> None:
    timed_out = RunCodeResponse(status=RunStatus.Failed, run_result=CommandRunResult(
        status=CommandRunStatus.TimeLimitExceeded, stdout="a\n", stderr=""))
    assert run_output(timed_out, 10, 100_000) == "a\n\nExecution timed out after 10 seconds."
    finished = RunCodeResponse(status=RunStatus.Success, run_result=CommandRunResult(
        status=CommandRunStatus.Finished, return_code=0, stdout="ok\n", stderr=""))
    assert run_output(finished, 10, 100_000) == "ok"


@pytest.mark.parametrize("action, observation", [
    (DOCS_ACTION, DOCS_OBSERVATION),
    ("<python>print(1)</python>", "\n<result>\n1\n</result>\n"),
    ("<python>print(1)</python>\n<result>", "\n1\n</result>\n"),
    ("```python\nprint(1)\n```", "\n```result\n1\n```\n"),
    ("```python\nprint(1)\n```\n```output", "\n1\n```\n"),
    ("<tool_call>```py\nprint(1)\n```</tool_call>", "\n<tool_response>\n```result\n1\n```\n</tool_response>\n"),
    ("```py\nprint(1)\n```", "\n<result>\n1\n</result>\n"),
])
def test_observation_markup_follows_the_action(action: str, observation: str) -> None:
    assert wrap_observation(action, "1" if "Hello" not in action else "Hello from Python!\nHello again!") == observation


def test_invalid_and_failure_observations_carry_an_empty_obs() -> None:
    invalid = invalid_observation()
    assert invalid["obs"] == "" and invalid["invalid_reason"] == "No valid tool found for action"
    assert "python_code" in invalid["available_tools"]
    failure = failure_observation("sandbox error: slot crashed")
    assert failure == {"obs": "", "error": "Tool processing failed: sandbox error: slot crashed",
                       "tool_type": "python_code"}


def test_without_set_up_the_program_is_the_code() -> None:
    assert build_program("print(1)", pre_import=False) == "print(1)"


def test_request_folds_top_level_finish_and_last_step_into_each_entry() -> None:
    request = GetObservationRequest.model_validate({
        "trajectory_ids": ["a", "b", "c"], "actions": ["<python>1</python>", "", "x"],
        "finish": [False, True, False], "is_last_step": [False, False, True],
        "extra_fields": [{"finish": True}, {}, {"is_last_step": False, "stdin": "in"}], "unknown": 1})
    steps = request.steps()
    assert [(s.trajectory_id, s.finish, s.is_last_step) for s in steps] == \
        [("a", True, False), ("b", True, False), ("c", False, False)]
    assert steps[2].extra_field["stdin"] == "in" and [s.index for s in steps] == [0, 1, 2]


def test_request_without_extra_fields_has_empty_ones() -> None:
    steps = GetObservationRequest.model_validate({"trajectory_ids": ["a"], "actions": ["x"]}).steps()
    assert steps[0].extra_field == {} and not steps[0].finish and not steps[0].is_last_step


@pytest.mark.parametrize("body, field", [
    ({"actions": ["x"]}, "trajectory_ids"),
    ({"trajectory_ids": [], "actions": []}, "trajectory_ids"),
    ({"trajectory_ids": ["a", "b"], "actions": ["x"]}, "actions"),
    ({"trajectory_ids": ["a"], "actions": ["x"], "extra_fields": [{}, {}]}, "extra_fields"),
    ({"trajectory_ids": ["a"], "actions": ["x"], "finish": [True, False]}, "finish"),
    ({"trajectory_ids": ["a"], "actions": ["x"], "is_last_step": "yes"}, "is_last_step"),
    ({"trajectory_ids": [1], "actions": ["x"]}, "trajectory_ids"),
    ({"trajectory_ids": ["a"], "actions": [["x"]]}, "actions"),
    ({"trajectory_ids": ["a"], "actions": ["x"], "extra_fields": [{"stdin": 5}]}, "extra_fields"),
])
def test_malformed_requests_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        GetObservationRequest.model_validate(body)
    assert excinfo.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize("fields", [{"run_timeout": 0}, {"run_timeout": 4000}, {"idle_ttl_s": 0}, {"idle_ttl_s": 4000}])
def test_config_refuses_time_limits_no_run_could_use(fields: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        VerlToolConfig(**fields)
