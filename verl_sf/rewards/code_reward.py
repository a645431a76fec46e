"""`CodeTestReward`: the TRL + Daytona example's code-test reward, run on verl-sf, with verdicts the code cannot forge.

A completion is cleaned (a continued function body, or a chat answer's fenced block), checked for banned patterns,
and run with a short time-out in a confined process that gets the task's inputs and returns its function's results
as plain data; the expected answers never enter that run (one reference run per task computes them), and the
comparison happens here.  Reward -1 for a banned pattern, an empty body or a program that failed (syntax error,
exception at top level, time-out, crash, exit before the results), else tests passed / total.  When the sandbox
could not run the code (unreachable, overloaded after bounded retries, SandboxError, a time-out spent waiting for a
CPU), the reward is None: TRL leaves it out of the reward sum, and the count is logged and exported as a metric.
What only an exploit does is counted too (`suspected_hacks`), with a reason per completion.

TRL::

    reward = CodeTestReward(TASKS, sandbox_url="http://127.0.0.1:8080")
    GRPOTrainer(..., reward_funcs=[reward])

verl (`custom_reward_function`, per-row tasks in `reward_model.ground_truth`)::

    reward.custom_reward_function.path=pkg://verl_sf.rewards.code_reward
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.sandbox_url=http://127.0.0.1:8080
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Optional, Union

from tqdm.auto import tqdm

from verl_sf.backends.base import SandboxBackend
from verl_sf.errors import VerlSfError
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus
from verl_sf.rewards.background_loop import BackgroundLoop
from verl_sf.rewards.code_harness import (
    TASK_FIELDS,
    Candidate,
    CodeTask,
    CodeTaskError,
    TaskReference,
    candidate_code,
    fenced_code,
    function_body,
    has_banned_pattern,
    parse_task,
    passed_tests,
    read_reference,
    read_report,
    reference_code,
)
from verl_sf.rewards.reward_metrics import SANDBOX_FAILURES, SUSPECTED_HACKS, TASK_ERRORS

logger = logging.getLogger(__name__)

FAILURE_REWARD = -1.0
DEFAULT_TIMEOUT_S = 1.0
DEFAULT_MAX_CONCURRENCY = 64
# The reference run executes only the task author's code: it gets at least this long, whatever `timeout_s` is.
REFERENCE_TIMEOUT_S = 10.0
# Task references kept per reward object (a dataset with per-row tests has one per distinct row task).
REFERENCE_CACHE_SIZE = 4096
# Batches at least this long get a progress bar unless `progress` says otherwise.
PROGRESS_MIN_BATCH = 64

Completion = Union[str, Sequence[Mapping[str, Any]]]
OnSandboxFailure = Literal["raise", "score"]


class SandboxFailure(VerlSfError):
    """verl's `compute_score` with on_sandbox_failure="raise": the sandbox gave no verdict for this sample."""


class Outcome(str, enum.Enum):
    scored = "scored"  # the harness ran to the end: reward passed / total
    banned = "banned"  # -1
    empty = "empty"  # -1
    error = "error"  # the program failed (syntax error, exception at top level, time-out, crash, early exit): -1
    sandbox_failure = "sandbox_failure"  # the sandbox could not run it: None
    task_error = "task_error"  # the task's tests or reference raised: None


@dataclasses.dataclass(frozen=True)
class CodeTestResult:
    """One completion's verdict; `reward` is None exactly when the outcome is not the code's doing."""

    outcome: Outcome
    reward: Optional[float]
    passed: int = 0
    total: int = 0
    detail: str = ""
    failure_reason: Optional[str] = None  # for sandbox failures: unavailable | sandbox_error | cpu_starved | harness
    suspects: tuple[str, ...] = ()  # what only an exploit does, each "kind: detail"

    @property
    def suspected_hack(self) -> Optional[str]:
        """A short reason for logging, or None when the completion did nothing only an exploit does."""
        return "; ".join(self.suspects) or None


class CodeTestReward:
    """A code-test reward for TRL (`reward_funcs=[...]`) and verl (`compute_score`), evaluated on verl-sf.

    Args:
        tasks: name -> task in the example's shape (`prompt`, `func_name`, `banned_patterns`, `tests`,
            `reference`; optionally `reference_code`).  May be empty when every row carries its own tests.
        sandbox_url: a verl-sf (or Sandbox Fusion) server, e.g. "http://127.0.0.1:8080".
        backend: "local" (our executor in this process), "http" (with `sandbox_url`) or any `SandboxBackend`
            instance (e.g. the cluster backend).  `close()` closes it.
        timeout_s: run time-out of one harness (the example uses 1 s).
        max_concurrency: harness runs in flight at once.
        max_retries: HTTP retries (connection errors, 429/502/503/504, Retry-After respected) before a
            completion counts as a sandbox failure.
        progress: tqdm bar per batch; None shows it for batches of at least PROGRESS_MIN_BATCH.
        name: TRL logs `rewards/<name>/mean`, `<name>/sandbox_failures` and `<name>/suspected_hacks`.
        on_sandbox_failure / failure_score: what `compute_score` (verl) returns for a sample the sandbox could
            not run: "raise" `SandboxFailure`, or "score" it `failure_score` with `sandbox_failure=1` reported.
    """

    def __init__(self, tasks: Optional[Mapping[str, Any]] = None, *, sandbox_url: Optional[str] = None,
                 backend: Union[SandboxBackend, Literal["http", "local"], None] = None,
                 local_options: Optional[dict[str, Any]] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_limit_mb: int = -1, max_concurrency: int = DEFAULT_MAX_CONCURRENCY, max_retries: int = 5,
                 progress: Optional[bool] = None, name: str = "code_test",
                 on_sandbox_failure: OnSandboxFailure = "raise", failure_score: float = 0.0):
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        if on_sandbox_failure not in ("raise", "score"):
            raise ValueError(f"on_sandbox_failure must be 'raise' or 'score', got {on_sandbox_failure!r}")
        # Validated now so a bad time-out or memory limit is an error here, not a rejected request per completion.
        self._request_fields = RunCodeRequest(code="", language="python", run_timeout=timeout_s,
                                              memory_limit_MB=memory_limit_mb).model_dump(
            include={"run_timeout", "memory_limit_MB"})
        self._reference_fields = {**self._request_fields,
                                  "run_timeout": max(REFERENCE_TIMEOUT_S, self._request_fields["run_timeout"])}
        self.tasks: dict[str, CodeTask] = {key: parse_task(key, spec) for key, spec in (tasks or {}).items()}
        self._tasks_by_prompt = {task.prompt: task for task in self.tasks.values() if task.prompt}
        self.backend = _backend_from(sandbox_url, backend, local_options, max_retries)
        self.max_concurrency = max_concurrency
        self.progress = progress
        self.__name__ = name
        self.on_sandbox_failure = on_sandbox_failure
        self.failure_score = float(failure_score)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.suspected_hacks = 0
        self.last_results: list[CodeTestResult] = []  # the last batch's verdicts, with reasons for logging
        self._outcomes_lock = threading.Lock()
        self._loop = BackgroundLoop(f"{name}-sandbox-loop")
        self._in_flight: Optional[asyncio.Semaphore] = None
        # Reference runs: finished ones (a reference or a task error) by task, and those in flight on the loop.
        self._references: collections.OrderedDict[CodeTask, Union[TaskReference, CodeTestResult]] = \
            collections.OrderedDict()
        self._reference_runs: dict[CodeTask, asyncio.Task[Union[TaskReference, CodeTestResult]]] = {}

    def __repr__(self) -> str:
        return f"CodeTestReward({self.__name__!r}, backend={self.backend!r}, tasks={sorted(self.tasks)})"

    @property
    def sandbox_failures(self) -> int:
        """Completions so far that got None because the sandbox could not run them."""
        return self.outcomes[Outcome.sandbox_failure.value]

    # ---- TRL ------------------------------------------------------------------------------------------------

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Completion],
                 **kwargs: Any) -> list[Optional[float]]:
        """TRL's reward function: one reward (or None) per completion; dataset columns arrive as kwargs."""
        tasks = [self._task_for_row(i, prompt, kwargs) for i, prompt in enumerate(prompts)]
        results = self.evaluate([candidate_of(completion) for completion in completions], tasks)
        log_metric: Optional[Callable[[str, float], None]] = kwargs.get("log_metric")
        if log_metric is not None:
            log_metric(f"{self.__name__}/sandbox_failures",
                       float(sum(r.outcome is Outcome.sandbox_failure for r in results)))
            log_metric(f"{self.__name__}/suspected_hacks", float(sum(bool(r.suspects) for r in results)))
        return [result.reward for result in results]

    # ---- verl -----------------------------------------------------------------------------------------------

    def compute_score(self, data_source: str, solution_str: str, ground_truth: Any,
                      extra_info: Optional[dict] = None, **kwargs: Any) -> dict[str, float]:
        """verl's custom reward: `ground_truth` is a task dict (or its JSON, or a name in `tasks`).

        A sample the sandbox could not run raises `SandboxFailure` (on_sandbox_failure="raise") or scores
        `failure_score` with `sandbox_failure=1.0` in the returned dict, which verl logs per sample, as it does
        `suspected_hack` (1.0 when the completion did something only an exploit does).
        """
        task = self._task_for_ground_truth(ground_truth)
        (result,) = self.evaluate([candidate_of_response(solution_str)], [task])
        if result.reward is None:
            if self.on_sandbox_failure == "raise":
                raise SandboxFailure(f"{self.__name__}: no verdict for a {data_source!r} sample "
                                     f"({result.outcome.value}): {result.detail}")
            score = self.failure_score
        else:
            score = result.reward
        return {"score": score, "acc": float(result.total > 0 and result.passed == result.total),
                "passed": float(result.passed), "total": float(result.total),
                "sandbox_failure": float(result.reward is None), "suspected_hack": float(bool(result.suspects))}

    # ---- evaluation -----------------------------------------------------------------------------------------

    def evaluate(self, candidates: Sequence[Candidate], tasks: Sequence[CodeTask]) -> list[CodeTestResult]:
        """Verdicts for cleaned candidates, one per task, run concurrently in the sandbox."""
        results = self._loop.run(self._evaluate(list(candidates), list(tasks)))
        self._record(results)
        return results

    def close(self) -> None:
        """Close the backend and stop the loop thread.  Idempotent."""
        self._loop.run(self.backend.close())
        self._loop.stop()
        self._in_flight = None
        self._reference_runs.clear()  # bound to the stopped loop; finished references stay

    def __enter__(self) -> CodeTestReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _evaluate(self, candidates: list[Candidate], tasks: list[CodeTask]) -> list[CodeTestResult]:
        if self._in_flight is None:
            self._in_flight = asyncio.Semaphore(self.max_concurrency)
        show = self.progress if self.progress is not None else len(candidates) >= PROGRESS_MIN_BATCH
        with tqdm(total=len(candidates), desc=self.__name__, unit="completion", disable=not show,
                  leave=False) as bar:
            async def one(candidate: Candidate, task: CodeTask) -> CodeTestResult:
                try:
                    return await self._evaluate_one(candidate, task)
                finally:
                    bar.update(1)

            return list(await asyncio.gather(*(one(c, t) for c, t in zip(candidates, tasks, strict=True))))

    async def _evaluate_one(self, candidate: Candidate, task: CodeTask) -> CodeTestResult:
        total = len(task.tests)
        if not candidate.code.strip():
            return CodeTestResult(Outcome.empty, FAILURE_REWARD, 0, total, "empty function body")
        banned = has_banned_pattern(candidate.code, task.banned_patterns)
        if banned is not None:
            return CodeTestResult(Outcome.banned, FAILURE_REWARD, 0, total, f"banned pattern {banned!r}")
        reference = await self._reference(task)
        if isinstance(reference, CodeTestResult):
            return reference
        request = RunCodeRequest(code=candidate_code(task, candidate, reference), language="python",
                                 **self._request_fields)
        try:
            response = await self._run(request)
        except Exception as exc:  # the backend boundary: whatever went wrong, the code never got a verdict
            return _sandbox_failure(total, "unavailable", f"{type(exc).__name__}: {exc}")
        return judge(response, reference)

    async def _run(self, request: RunCodeRequest) -> RunCodeResponse:
        assert self._in_flight is not None
        async with self._in_flight:
            return await self.backend.run_code(request)

    async def _reference(self, task: CodeTask) -> Union[TaskReference, CodeTestResult]:
        """The task's inputs and expected answers: one reference run per task, shared by concurrent completions."""
        known = self._references.get(task)
        if known is not None:
            self._references.move_to_end(task)
            return known
        run = self._reference_runs.get(task)
        if run is None:
            run = self._reference_runs[task] = asyncio.ensure_future(self._run_reference(task))
            run.add_done_callback(lambda _: self._reference_runs.pop(task, None))
        return await asyncio.shield(run)

    async def _run_reference(self, task: CodeTask) -> Union[TaskReference, CodeTestResult]:
        total = len(task.tests)
        request = RunCodeRequest(code=reference_code(task), language="python", **self._reference_fields)
        try:
            response = await self._run(request)
        except Exception as exc:
            return _sandbox_failure(total, "unavailable", f"the task's reference run: {type(exc).__name__}: {exc}")
        result = judge_reference(response, total)
        if isinstance(result, TaskReference) or result.outcome is Outcome.task_error:
            self._references[task] = result
            if len(self._references) > REFERENCE_CACHE_SIZE:
                self._references.popitem(last=False)
        return result

    def _record(self, results: Sequence[CodeTestResult]) -> None:
        hacks = [r for r in results if r.suspects]
        with self._outcomes_lock:
            self.outcomes.update(result.outcome.value for result in results)
            self.suspected_hacks += len(hacks)
            self.last_results = list(results)
        for result in hacks:
            for kind in dict.fromkeys(suspect.split(":", 1)[0] for suspect in result.suspects):
                SUSPECTED_HACKS.labels(self.__name__, kind).inc()
        if hacks:
            logger.info("%s: %d of %d completions did what only an exploit does; first: %s", self.__name__,
                        len(hacks), len(results), hacks[0].suspected_hack)
        failures = [r for r in results if r.outcome is Outcome.sandbox_failure]
        for result in failures:
            SANDBOX_FAILURES.labels(self.__name__, result.failure_reason or "unavailable").inc()
        if failures:
            logger.warning("%s: %d of %d completions got no verdict from the sandbox (reward None); first: %s",
                           self.__name__, len(failures), len(results), failures[0].detail)
        task_errors = [r for r in results if r.outcome is Outcome.task_error]
        if task_errors:
            TASK_ERRORS.labels(self.__name__).inc(len(task_errors))
            logger.warning("%s: %d completions unscored because the task's tests or reference raised: %s",
                           self.__name__, len(task_errors), task_errors[0].detail)

    # ---- tasks ----------------------------------------------------------------------------------------------

    def _task_for_row(self, index: int, prompt: Any, columns: Mapping[str, Any]) -> CodeTask:
        """Per-row `tests` (and friends) columns, else a `task` column naming one of `tasks`, else the prompt."""
        if "tests" in columns:
            row = {key: columns[key][index] for key in TASK_FIELDS
                   if key in columns and columns[key][index] is not None}
            row.setdefault("prompt", prompt if isinstance(prompt, str) else "")
            return parse_task(f"row {index}", row)
        if "task" in columns:
            return self._named_task(columns["task"][index])
        text = prompt if isinstance(prompt, str) else _last_message(prompt, "user")
        task = self._tasks_by_prompt.get(text)
        if task is None:
            raise CodeTaskError(f"{self.__name__}: no task has the prompt {text[:80]!r}...; give the dataset a "
                                f"'task' column naming one of {sorted(self.tasks)} or per-row 'tests', "
                                f"'func_name' and 'reference' columns")
        return task

    def _task_for_ground_truth(self, ground_truth: Any) -> CodeTask:
        if isinstance(ground_truth, str) and ground_truth in self.tasks:
            return self.tasks[ground_truth]
        if isinstance(ground_truth, Mapping):
            ground_truth = {key: value for key, value in ground_truth.items() if key in TASK_FIELDS}
        return parse_task("ground_truth", ground_truth)

    def _named_task(self, name: Any) -> CodeTask:
        try:
            return self.tasks[name]
        except (KeyError, TypeError):
            raise CodeTaskError(f"{self.__name__}: unknown task {name!r}; known: {sorted(self.tasks)}") from None


def judge(response: RunCodeResponse, reference: TaskReference) -> CodeTestResult:
    """The verdict of one candidate run: its results compared with the reference's answers here; the code's
    failure is -1, the sandbox's failure None."""
    total = len(reference.expected)
    run = response.run_result
    if response.status == RunStatus.SandboxError or run is None:
        return _sandbox_failure(total, "sandbox_error", response.message or "SandboxError without a run result")
    if getattr(run, "cpu_starved", False):
        return _sandbox_failure(total, "cpu_starved", "the run's time went to waiting for a CPU")
    report = read_report(run.stdout or "")
    suspects = list(report.suspects)
    if response.status != RunStatus.Success:
        last_error = (run.stderr or "").strip().splitlines()[-1:] or [f"exit code {run.return_code}"]
        return _failed(total, f"{run.status.value}: {last_error[0]}", suspects)
    if report.state == "setup_error":
        return _sandbox_failure(total, "harness", f"the harness could not confine the candidate: {report.detail}")
    if report.state in ("program_error", "error"):
        return _failed(total, report.detail, suspects)
    if report.state != "done" or len(report.tests) != total:
        return _failed(total, "the harness printed no report", [*suspects, "protocol: no harness report"])
    passed, more = passed_tests(report, reference)
    return CodeTestResult(Outcome.scored, passed / total, passed, total, suspects=_distinct([*suspects, *more]))


def judge_reference(response: RunCodeResponse, total: int) -> Union[TaskReference, CodeTestResult]:
    """The reference run's inputs and answers; a task that cannot be checked is a task error (None), as is a
    sandbox failure."""
    run = response.run_result
    if response.status == RunStatus.SandboxError or run is None:
        return _sandbox_failure(total, "sandbox_error", response.message or "SandboxError without a run result")
    if getattr(run, "cpu_starved", False):
        return _sandbox_failure(total, "cpu_starved", "the task's reference run waited for a CPU")
    if response.status != RunStatus.Success:
        last_error = (run.stderr or "").strip().splitlines()[-1:] or [f"exit code {run.return_code}"]
        return CodeTestResult(Outcome.task_error, None, 0, total,
                              f"the task's tests and reference failed: {run.status.value}: {last_error[0]}")
    reference = read_reference(run.stdout or "")
    if isinstance(reference, str):
        return CodeTestResult(Outcome.task_error, None, 0, total, reference)
    if len(reference.expected) != total:
        return CodeTestResult(Outcome.task_error, None, 0, total, "the reference run gave a wrong number of inputs")
    return reference


def _failed(total: int, detail: str, suspects: list[str]) -> CodeTestResult:
    return CodeTestResult(Outcome.error, FAILURE_REWARD, 0, total, detail, suspects=_distinct(suspects))


def _distinct(suspects: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(suspects))


def _sandbox_failure(total: int, reason: str, detail: str) -> CodeTestResult:
    return CodeTestResult(Outcome.sandbox_failure, None, 0, total, detail, failure_reason=reason)


def candidate_of(completion: Completion) -> Candidate:
    """TRL: plain text continues the task's prompt (the example); a conversation's last answer is a whole program."""
    if isinstance(completion, str):
        return Candidate(function_body(completion), continues_prompt=True)
    return Candidate(fenced_code(_last_message(completion, "assistant")), continues_prompt=False)


def candidate_of_response(text: str) -> Candidate:
    """verl's decoded response: a fenced block if it has one (chat models), else a continued body (base models)."""
    return Candidate(fenced_code(text), continues_prompt=False) if "```" in text else candidate_of(text)


def _last_message(messages: Any, role: str) -> str:
    """Text of the last `role` message of a TRL conversation (content as a string or a list of text parts)."""
    for message in reversed(list(messages)):
        if isinstance(message, Mapping) and message.get("role") == role:
            content = message.get("content") or ""
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return ""


def _backend_from(sandbox_url: Optional[str], backend: Union[SandboxBackend, str, None],
                  local_options: Optional[dict[str, Any]], max_retries: int) -> SandboxBackend:
    if isinstance(backend, SandboxBackend):
        if sandbox_url is not None:
            raise ValueError("give either sandbox_url or a backend instance, not both")
        return backend
    if backend == "local":
        if sandbox_url is not None:
            raise ValueError("backend='local' runs code in this process: sandbox_url must not be set")
        from verl_sf.backends.config import parse_backend_config

        return parse_backend_config({"type": "local", "executor": dict(local_options or {})}).build()
    if backend in (None, "http"):
        if not sandbox_url:
            raise ValueError("CodeTestReward needs sandbox_url (a verl-sf server), backend='local' or a "
                             "SandboxBackend instance")
        from verl_sf.backends.http import HttpSandboxBackend

        return HttpSandboxBackend(sandbox_url, max_retries=max_retries)
    raise ValueError(f"backend must be 'http', 'local' or a SandboxBackend instance, got {backend!r}")


_SHARED: dict[tuple, CodeTestReward] = {}
_SHARED_LOCK = threading.Lock()


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, *,
                  sandbox_url: Optional[str] = None, backend: Literal["http", "local"] = "http",
                  timeout_s: float = DEFAULT_TIMEOUT_S, on_sandbox_failure: OnSandboxFailure = "raise",
                  failure_score: float = 0.0, max_retries: int = 5, **kwargs: Any) -> dict[str, float]:
    """verl's `custom_reward_function`: the options come from `reward_kwargs`; one reward object per option set
    is kept for the process, so connections (or the local executor) are reused across calls."""
    key = (sandbox_url, backend, float(timeout_s), on_sandbox_failure, float(failure_score), max_retries)
    with _SHARED_LOCK:
        reward = _SHARED.get(key)
        if reward is None:
            reward = _SHARED[key] = CodeTestReward(
                sandbox_url=sandbox_url if backend == "http" else None, backend=backend, timeout_s=timeout_s,
                on_sandbox_failure=on_sandbox_failure, failure_score=failure_score, max_retries=max_retries,
                progress=False)
    return reward.compute_score(data_source, solution_str, ground_truth, extra_info)


__all__ = ["Candidate", "CodeTask", "CodeTaskError", "CodeTestResult", "CodeTestReward", "Outcome", "SandboxFailure",
           "candidate_of", "candidate_of_response", "compute_score", "judge", "judge_reference"]
