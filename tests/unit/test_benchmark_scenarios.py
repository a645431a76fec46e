"""The benchmark script's pure pieces: percentiles, and how each scenario's answer is judged."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench.runner import percentile  # noqa: E402
from bench.scenarios import SCENARIOS, Outcome, classify  # noqa: E402
from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus  # noqa: E402


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([float(v) for v in range(1, 101)], 0.95) == pytest.approx(95.05)


def _response(status: RunStatus, run_status: CommandRunStatus, rc: int, stdout: str = "", stderr: str = "") -> RunCodeResponse:
    return RunCodeResponse(status=status, run_result=CommandRunResult(status=run_status, return_code=rc,
                                                                      stdout=stdout, stderr=stderr))


def test_classify_judges_each_scenario_by_status_and_output() -> None:
    simple, error = SCENARIOS["simple_stdout"], SCENARIOS["runtime_error"]
    finished, tle = CommandRunStatus.Finished, CommandRunStatus.TimeLimitExceeded
    assert classify(simple, _response(RunStatus.Success, finished, 0, "4\n")) == Outcome.ok
    assert classify(simple, _response(RunStatus.Success, finished, 0, "5\n")) == Outcome.wrong
    assert classify(simple, _response(RunStatus.Failed, tle, -9)) == Outcome.timeout
    assert classify(simple, RunCodeResponse(status=RunStatus.SandboxError, message="boom")) == Outcome.error
    traceback = "Traceback (most recent call last):\nValueError: boom\n"
    assert classify(error, _response(RunStatus.Failed, finished, 1, "", traceback)) == Outcome.ok
    # An error that was swallowed (status Success) or another exception is a failure.
    assert classify(error, _response(RunStatus.Success, finished, 0, "", traceback)) == Outcome.wrong
    assert classify(error, _response(RunStatus.Failed, finished, 1, "", "KeyError: 1")) == Outcome.wrong
