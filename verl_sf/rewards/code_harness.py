"""Code-test tasks and the pure steps around the runs: clean a completion, build the runs' code, read what they print.

The task shape (`prompt`, `func_name`, `banned_patterns`, `tests`, `reference`) and the scoring rules are those of
the TRL + Daytona GRPO example, so a `TASKS` dict written for it works unchanged.  A task takes two kinds of run
(see `sandbox_harness`): one reference run per task gives its inputs and expected answers, which stay here; each
candidate run gets the inputs only and returns results as plain data, compared here.  Nothing here touches a sandbox.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import itertools
import json
import marshal
import re
import zlib
from collections.abc import Mapping
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from verl_sf.errors import VerlSfError
from verl_sf.rewards import sandbox_harness

# The example's body rule: a base model continues the function, so its body ends at the first unindented line.
BODY_INDENT = "    "
# ```python, ```py or a bare ``` fence; chat models put the whole function in one.
_FENCED_BLOCK = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
TASK_FIELDS = ("prompt", "func_name", "banned_patterns", "tests", "reference", "reference_code")


class CodeTaskError(VerlSfError, ValueError):
    """A task (or a dataset row's test columns) is malformed or names something that does not exist."""


class CodeTask(BaseModel):
    """One function-writing task: the model's function is called on every test input and compared with `reference`.

    `tests` are Python expressions giving one input each (they may use `random`, seeded with 0 as in the example);
    `reference` is an expression naming the correct function: a builtin such as `sorted`, the example's `_kadane`,
    or a function defined by `reference_code`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = ""
    func_name: str
    banned_patterns: tuple[str, ...] = ()
    tests: tuple[str, ...]
    reference: str
    reference_code: str = ""

    @field_validator("func_name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not value.isidentifier():
            raise ValueError(f"must be a Python identifier, got {value!r}")
        return value

    @field_validator("tests")
    @classmethod
    def _tests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or any(not test.strip() for test in value):
            raise ValueError("must be a non-empty list of non-empty Python expressions")
        return value

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name the reference function, e.g. 'sorted'")
        return value


def parse_task(name: str, spec: Any) -> CodeTask:
    """A `CodeTask` from a dict in the example's shape (or a JSON text of one); errors name the task and field."""
    if isinstance(spec, CodeTask):
        return spec
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise CodeTaskError(f"task {name!r} is a string but not a JSON object: {exc}") from None
    if not isinstance(spec, Mapping):
        raise CodeTaskError(f"task {name!r} must be a dict with {list(TASK_FIELDS)}, got {type(spec).__name__}")
    try:
        return CodeTask.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(task)'}: {e['msg']}" for e in exc.errors())
        raise CodeTaskError(f"task {name!r} is invalid: {problems}") from None


def function_body(completion: str) -> str:
    """The continued function body: lines up to the first non-empty one not indented by four spaces."""
    lines = itertools.takewhile(lambda line: not line or line.startswith(BODY_INDENT), completion.splitlines())
    return "\n".join(lines).rstrip()


def fenced_code(text: str) -> str:
    """The last fenced Python block of a chat answer (models draft, then answer), or the text itself if unfenced."""
    blocks = _FENCED_BLOCK.findall(text)
    return blocks[-1].strip("\n") if blocks else text.strip("\n")


def has_banned_pattern(code: str, banned_patterns: tuple[str, ...]) -> Optional[str]:
    """The first banned pattern found in `code`, case-insensitively as the example does, or None."""
    lowered = code.lower()
    return next((pattern for pattern in banned_patterns if pattern.lower() in lowered), None)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """The model's cleaned code: a body that continues the task's prompt, or a whole program (a chat answer)."""

    code: str
    continues_prompt: bool


# ---- the two runs: their code, and what they print ------------------------------------------------------------------

HARNESS_SOURCE = sandbox_harness.source()


def _shipped(source: str) -> str:
    """The harness as the first lines of a run's code (it imports nothing of ours in the sandbox): its bytecode,
    compressed, where the sandbox's Python reads this interpreter's bytecode (same magic number), else its source.
    Compiling the harness took a run 3-4 ms of CPU; loading its bytecode takes under 1."""
    bytecode = base64.b64encode(zlib.compress(marshal.dumps(compile(source, "verl_sf_harness.py", "exec")), 9))
    text = base64.b64encode(zlib.compress(source.encode(), 9))
    return ("import base64, importlib.util, marshal, zlib\n"
            f"if importlib.util.MAGIC_NUMBER == {importlib.util.MAGIC_NUMBER!r}:\n"
            f"    exec(marshal.loads(zlib.decompress(base64.b64decode({bytecode.decode()!r}))))\n"
            "else:\n"
            f"    exec(zlib.decompress(base64.b64decode({text.decode()!r})))\n")


HARNESS = _shipped(HARNESS_SOURCE)


def reference_code(task: CodeTask) -> str:
    """The run that evaluates the task's inputs and the reference's answers, with no candidate code in it."""
    spec = {key: getattr(task, key) for key in ("tests", "reference", "reference_code")}
    return f"{HARNESS}reference_run({json.dumps(spec)!r})\n"


@dataclasses.dataclass(frozen=True)
class TaskReference:
    """A task's inputs (encoded JSON, as sent to every candidate run) and the expected answers, kept by the caller."""

    inputs_json: str
    expected: tuple[Any, ...]


def read_reference(stdout: str) -> Union[TaskReference, str]:
    """What the reference run printed: the reference, or why the task itself cannot be checked."""
    try:
        printed = json.loads(stdout)
        if isinstance(printed, dict) and isinstance(printed.get("task_error"), str):
            return printed["task_error"]
        inputs, expected = printed["inputs"], printed["expected"]
        if not isinstance(inputs, list) or not isinstance(expected, list) or len(inputs) != len(expected):
            raise ValueError("inputs and expected answers do not pair up")
        return TaskReference(json.dumps(inputs), tuple(sandbox_harness.decode(value) for value in expected))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return f"the reference run printed no inputs and answers ({type(exc).__name__}: {str(exc)[:200]})"


def candidate_code(task: CodeTask, candidate: Candidate, reference: TaskReference) -> str:
    """The run of the model's program (prompt + body, or a whole chat block) on the task's inputs, confined."""
    program = f"{task.prompt}\n{candidate.code}" if candidate.continues_prompt else candidate.code
    spec = (f'{{"func_name": {json.dumps(task.func_name)}, "program": {json.dumps(program)}, '
            f'"inputs": {reference.inputs_json}}}')
    return f"{HARNESS}candidate_run({spec!r})\n"


@dataclasses.dataclass(frozen=True)
class HarnessReport:
    """What a candidate run printed: its final state (None if it printed no report), one entry per test when the
    state is `done`, and every suspicion, as `kind: detail`."""

    state: Optional[str]
    tests: tuple[dict, ...] = ()
    detail: str = ""
    suspects: tuple[str, ...] = ()


def read_report(stdout: str) -> HarnessReport:
    """The harness parent's lines (nothing else writes this run's stdout): suspicions, then one report."""
    suspects: list[str] = []
    report: Optional[dict] = None
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # a harness line is never nested deep, whatever it carries
            message = None
        suspect = message.get("suspect") if isinstance(message, dict) else None
        if (isinstance(suspect, list) and len(suspect) == 2 and suspect[0] in sandbox_harness.SUSPECT_KINDS
                and isinstance(suspect[1], str)):
            suspects.append(f"{suspect[0]}: {suspect[1]}")
        elif isinstance(message, dict) and isinstance(message.get("report"), dict) and report is None:
            report = message["report"]
        else:
            suspects.append(f"protocol: the harness printed an unexpected line {line[:80]!r}")
    if report is None or report.get("state") not in ("done", "program_error", "setup_error", "error"):
        return HarnessReport(None, suspects=tuple(suspects))
    tests = report.get("tests")
    return HarnessReport(report["state"], tuple(tests) if isinstance(tests, list) else (),
                         str(report.get("detail", "")), tuple(suspects))


def passed_tests(report: HarnessReport, reference: TaskReference) -> tuple[int, list[str]]:
    """Tests whose result equals the expected answer, compared here, as plain values of exact builtin types."""
    passed, suspects = 0, []
    for test, want in zip(report.tests, reference.expected, strict=False):  # lengths checked by the caller
        if not isinstance(test, dict) or "result" not in test:
            continue
        try:
            passed += sandbox_harness.decode(test["result"]) == want
        except (sandbox_harness.NotPlainData, RecursionError) as exc:
            suspects.append(f"non_plain_result: {str(exc)[:120]}")
    return passed, suspects
