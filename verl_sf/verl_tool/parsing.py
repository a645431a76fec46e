"""verl-tool's python_code formats: code out of an action's text, observation text out of a run.

The rules follow verl-tool's `PythonCodeTool` (parse_action, execute_python, postprocess_observation)
so that a policy trained against its server reads the same text here.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Union

from verl_sf.models import CommandRunStatus, RunCodeResponse

Observation = Union[str, dict[str, Any]]

TOOL_TYPE = "python_code"
USAGE = "You are able to write and execute Python code securely inside a sandbox."
# Tried in order; the first syntax with any block wins and all of its blocks run, joined.
CODE_BLOCK_SYNTAXES = (
    re.compile(r"<python>(.*?)</python>", re.DOTALL),
    re.compile(r"```\n?python(.*?)```", re.DOTALL),
    re.compile(r"```\n?py(.*?)```", re.DOTALL),
)
STDIN_BLOCK = re.compile(r"```input\n(.*?)\n```", re.DOTALL)
# The run's own file as the code knows it (verl-tool strips its temp dir the same way).
MAIN_FILE_PATH = re.compile(r'File "/[^"\n]*/main\.py"')
OUTPUT_TAG = "result"
# What a session's interrupted call prints last: the server's doing at the time-out, not the code's error.
INTERRUPT_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(?:  .*\n)*KeyboardInterrupt\n?\Z")


def extract_code(action: str) -> Optional[str]:
    """Every `<python>` block of the action or, without any, every fenced python block; None without code."""
    for syntax in CODE_BLOCK_SYNTAXES:
        blocks = syntax.findall(action)
        if blocks:
            return "\n".join(block.strip() for block in blocks)
    return None


def extract_stdin(action: str, default: Optional[str]) -> Optional[str]:
    """An ```input block in the action overrides the stdin the request's extra_fields carry."""
    blocks = STDIN_BLOCK.findall(action)
    return blocks[0].strip() if blocks else default


def render_output(stdout: str, stderr: str, timed_out: bool, timeout: float, limit: int) -> str:
    """stdout then stderr, a time-out said in verl-tool's words, trimmed and cut to `limit` characters."""
    stdout, stderr = MAIN_FILE_PATH.sub('File "main.py"', stdout), MAIN_FILE_PATH.sub('File "main.py"', stderr)
    if timed_out:
        stderr = INTERRUPT_TRACEBACK.sub("", stderr) + f"Execution timed out after {timeout:g} seconds.\n"
    return f"{stdout}\n{stderr}".strip(" \n")[:limit]


def run_output(response: RunCodeResponse, timeout: float, limit: int) -> str:
    run = response.run_result
    if run is None:
        return render_output("", response.message, False, timeout, limit)
    timed_out = run.status == CommandRunStatus.TimeLimitExceeded
    return render_output(run.stdout or "", run.stderr or "", timed_out, timeout, limit)


def wrap_observation(action: str, output: str) -> str:
    """The output in the markup the action was written in, so the policy's next turn continues it."""
    if "```output" in action or "```python" in action:
        if action.count("```") % 2 == 0:
            return f"\n```{OUTPUT_TAG}\n{output}\n```\n"
        return f"\n{output}\n```\n"  # the action opened an output block: close it
    if "</tool_call>" in action:
        return f"\n<tool_response>\n```{OUTPUT_TAG}\n{output}\n```\n</tool_response>\n"
    if action.strip(" \n").endswith(f"<{OUTPUT_TAG}>"):
        return f"\n{output}\n</{OUTPUT_TAG}>\n"
    return f"\n<{OUTPUT_TAG}>\n{output}\n</{OUTPUT_TAG}>\n"


def invalid_observation() -> dict[str, Any]:
    """What verl-tool's server answers for an action no tool can parse (with `valids` false)."""
    return {"obs": "", "invalid_reason": "No valid tool found for action",
            "available_tools": f"Available tools:\n• {TOOL_TYPE}: {USAGE}"}


def failure_observation(reason: str) -> dict[str, Any]:
    """What verl-tool's server answers when the tool itself failed, not the code (with `dones` true)."""
    return {"obs": "", "error": f"Tool processing failed: {reason}", "tool_type": TOOL_TYPE}
