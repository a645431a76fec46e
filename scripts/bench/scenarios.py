"""The benchmark's workloads and the one rule that says whether a call succeeded.

The first three scenarios are the Daytona verl-retool guide's (same names, same code, same
expected output), so numbers are comparable with its published ones; numpy and sympy measure
what a per-call interpreter start really costs: re-importing a heavy library every time.
`session_print` is simple_stdout's call in a live session (one per virtual client, created
before the level and ended after it); `http_ping` is one HTTP round trip to /v1/ping, the floor
a call over HTTP cannot beat.  Backends without sessions or without that endpoint skip them.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Optional

from verl_sf.models import CommandRunStatus, RunCodeResponse, RunStatus


class Kind(str, Enum):
    """What one call of a scenario is."""

    run = "run"          # a stateless POST /run_code
    session = "session"  # POST /run_code in the virtual client's own live session
    ping = "ping"        # GET /v1/ping: no code runs


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    code: str
    expected: str  # substring of stdout (or of stderr when expects_error)
    expects_error: bool = False
    kind: Kind = Kind.run


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("simple_stdout", "print(2 + 2)", "4"),
    Scenario("cpu_bound_stdout", "total = 0\nfor i in range(20000):\n    total += i * i\nprint(total)\n",
             "2666466670000"),
    Scenario("runtime_error", "raise ValueError('boom from benchmark')", "ValueError", expects_error=True),
    Scenario("numpy", "import numpy as np\nprint(np.arange(10).sum())\n", "45"),
    Scenario("sympy", 'import sympy as sp\nx = sp.symbols("x")\nprint(sp.solve(x**2 - 4, x))\n', "[-2, 2]"),
    Scenario("session_print", "print(2 + 2)", "4", kind=Kind.session),
    Scenario("http_ping", "", "pong", kind=Kind.ping),
)}


class Outcome(str, Enum):
    """How one call ended; everything but `ok` counts in failure_count."""

    ok = "ok"
    wrong = "wrong"                    # answered, but not with the expected status/output
    timeout = "timeout"                # the sandbox reported TimeLimitExceeded
    client_timeout = "client_timeout"  # no answer within the benchmark's own deadline
    error = "error"                    # transport error, SandboxError, HTTP error


def classify(scenario: Scenario, response: RunCodeResponse) -> Outcome:
    """Success is status Success with the expected stdout, or for runtime_error the expected
    Failed run whose stderr names ValueError (an error that is not propagated is a failure)."""
    run = response.run_result
    if run is not None and run.status == CommandRunStatus.TimeLimitExceeded:
        return Outcome.timeout
    if response.status == RunStatus.SandboxError:
        return Outcome.error
    if scenario.expects_error:
        good = response.status == RunStatus.Failed and run is not None and scenario.expected in (run.stderr or "")
    else:
        good = response.status == RunStatus.Success and run is not None and scenario.expected in (run.stdout or "")
    return Outcome.ok if good else Outcome.wrong


def describe_failure(response: Optional[RunCodeResponse], error: Optional[str]) -> str:
    """A short line for summary.json so a failing level can be diagnosed without a re-run."""
    if response is None:
        return (error or "no response")[:300]
    run = response.run_result
    parts = [f"status={response.status.value}"]
    if response.message:
        parts.append(f"message={response.message[:120]!r}")
    if run is not None:
        parts.append(f"run={run.status.value} rc={run.return_code}")
        parts.append(f"stdout={(run.stdout or '')[:80]!r} stderr={(run.stderr or '')[-160:]!r}")
    return " ".join(parts)
