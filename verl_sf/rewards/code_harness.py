"""Code-test tasks and the pure steps around one run: clean a completion, build its harness, read the verdict.

The task shape (`prompt`, `func_name`, `banned_patterns`, `tests`, `reference`) and the scoring rules are those of
the TRL + Daytona GRPO example, so a `TASKS` dict written for it works unchanged.  Nothing here touches a sandbox.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Mapping
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from verl_sf.errors import VerlSfError

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


# Runs after the model's code in the same file.  Inputs and expected outputs are computed before the candidate runs,
# in a namespace it cannot reach by name; a test that raises (or calls sys.exit) fails that test only.
_RUNNER = '''

def _verl_sf_run_tests(spec_json):
    import copy, json, random

    def _kadane(xs):
        best = running = xs[0]
        for x in xs[1:]:
            running = max(x, running + x)
            best = max(best, running)
        return best

    spec = json.loads(spec_json)
    random.seed(0)
    namespace = {"random": random, "_kadane": _kadane}
    try:
        exec(spec["reference_code"], namespace)
        reference = eval(spec["reference"], namespace)
        inputs = [eval(test, namespace) for test in spec["tests"]]
        expected = [reference(copy.deepcopy(value)) for value in inputs]
    except Exception as exc:
        print(json.dumps({"task_error": f"{type(exc).__name__}: {exc}"}))
        return
    candidate = globals()[spec["func_name"]]
    results = []
    for value, want in zip(inputs, expected):
        try:
            results.append(bool(candidate(copy.deepcopy(value)) == want))
        except BaseException:
            results.append(False)
    print(json.dumps({"results": results}))

'''


@dataclasses.dataclass(frozen=True)
class Candidate:
    """The model's cleaned code: a body that continues the task's prompt, or a whole program (a chat answer)."""

    code: str
    continues_prompt: bool


def build_harness(task: CodeTask, candidate: Candidate) -> str:
    """The file the sandbox runs: the model's program (prompt + body, or a whole chat block), then the test runner."""
    program = f"{task.prompt}\n{candidate.code}" if candidate.continues_prompt else candidate.code
    spec = {key: getattr(task, key) for key in ("func_name", "tests", "reference", "reference_code")}
    return f"{program}\n{_RUNNER}\n_verl_sf_run_tests({json.dumps(spec)!r})\n"


@dataclasses.dataclass(frozen=True)
class HarnessReport:
    """What the runner printed: tests passed out of `total`, or why the task itself could not be checked."""

    passed: int
    total: int
    task_error: Optional[str] = None


def read_harness_output(stdout: str, num_tests: int) -> Optional[HarnessReport]:
    """The verdict on stdout's last line, or None when there is none (the program broke the harness)."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        verdict = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(verdict, dict):
        return None
    if isinstance(verdict.get("task_error"), str):
        return HarnessReport(0, num_tests, task_error=verdict["task_error"])
    results = verdict.get("results")
    if not isinstance(results, list) or len(results) != num_tests or not all(isinstance(r, bool) for r in results):
        return None
    return HarnessReport(sum(results), num_tests)
