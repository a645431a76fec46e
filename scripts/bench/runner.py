"""The load loop, with the Daytona verl-retool guide's meaning of its knobs.

At concurrency c, one *iteration* is a batch of c calls started together; the next batch
starts when the whole batch has answered.  `warmup` batches run first and are not measured,
then `iterations` measured batches: c * iterations measured calls per level (so iterations is
also the number of calls each of the c virtual clients makes).  Throughput is measured calls
divided by the summed wall time of the measured batches; a `pause_s` after each batch (a
rollout generating between its tool calls) is not part of it.  The run is bounded: every call has
a deadline (`client_timeout`), and the number of calls is fixed up front.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Optional

from bench.backends import BenchBackend
from bench.memory import PeakSampler
from bench.scenarios import Kind, Outcome, Scenario, classify, describe_failure
from verl_sf.models import RunCodeRequest, RunCodeResponse

MAX_FAILURE_SAMPLES = 5


@dataclasses.dataclass
class Settings:
    warmup: int
    iterations: int
    run_timeout: float
    client_timeout: float
    memory_limit_mb: int
    memory_interval: float
    pause_s: float = 0.0


@dataclasses.dataclass
class Call:
    latency_s: float
    outcome: Outcome
    queue_wait_s: Optional[float]
    detail: str  # empty on success


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `values` non-empty."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def client_session(client: int) -> str:
    """The session key of virtual client `client` in a session scenario."""
    return f"bench-client-{client}"


async def one_call(backend: BenchBackend, scenario: Scenario, request: RunCodeRequest,
                   settings: Settings, session: Optional[str] = None) -> Call:
    started = time.perf_counter()
    response: Optional[RunCodeResponse] = None
    error: Optional[str] = None
    try:
        if scenario.kind == Kind.ping:
            answer = await asyncio.wait_for(backend.ping(), settings.client_timeout)
            outcome, error = (Outcome.ok, None) if answer == scenario.expected else (Outcome.wrong, repr(answer))
        else:
            response = await asyncio.wait_for(backend.run_code(request, session=session), settings.client_timeout)
            outcome = classify(scenario, response)
    except asyncio.TimeoutError:
        outcome, error = Outcome.client_timeout, f"no answer within --client-timeout {settings.client_timeout:g} s"
    except Exception as exc:  # any failure to get an answer is a counted error, not a crash
        outcome, error = Outcome.error, f"{type(exc).__name__}: {exc}"
    latency = time.perf_counter() - started
    detail = "" if outcome == Outcome.ok else f"{outcome.value}: {describe_failure(response, error)}"
    return Call(latency, outcome, response.queue_wait if response is not None else None, detail)


async def measure_level(backend: BenchBackend, scenario: Scenario, concurrency: int, settings: Settings,
                        on_call_done: Callable[[], None]) -> dict:
    """Warm up, then measure one (scenario, concurrency) level; returns one results row.

    A session scenario first creates one session per virtual client (unmeasured) and ends them after."""

    # Built once: the load generator shares two cores with the server, so it does no
    # per-call work it can avoid.
    request = RunCodeRequest(code=scenario.code, language="python", run_timeout=settings.run_timeout,
                             memory_limit_MB=settings.memory_limit_mb)

    sessions = [client_session(i) if scenario.kind == Kind.session else None for i in range(concurrency)]

    async def tracked(session: Optional[str]) -> Call:
        call = await one_call(backend, scenario, request, settings, session)
        on_call_done()
        return call

    if scenario.kind == Kind.session:
        opening = RunCodeRequest(code="pass", language="python", run_timeout=settings.run_timeout,
                                 memory_limit_MB=settings.memory_limit_mb)
        await asyncio.gather(*(backend.run_code(opening, session=session) for session in sessions))
    try:
        for _ in range(settings.warmup):
            await asyncio.gather(*(tracked(session) for session in sessions))
            await asyncio.sleep(settings.pause_s)

        calls: list[Call] = []
        measured_wall = 0.0
        cpu_started = time.thread_time()  # the event loop's thread: not the memory sampler's
        async with PeakSampler(backend.memory_root_pid, settings.memory_interval) as memory:
            for _ in range(settings.iterations):
                started = time.perf_counter()
                calls.extend(await asyncio.gather(*(tracked(session) for session in sessions)))
                measured_wall += time.perf_counter() - started
                await asyncio.sleep(settings.pause_s)
        client_cpu = time.thread_time() - cpu_started
    finally:
        await asyncio.gather(*(backend.end_session(session) for session in sessions if session))
    return summarize_level(scenario.name, concurrency, calls, measured_wall, memory.peak_mb, client_cpu)


def summarize_level(scenario: str, concurrency: int, calls: list[Call], measured_wall: float,
                    peak_memory_mb: Optional[float], client_cpu_s: float) -> dict:
    """The guide's columns first, then ours (counts by failure kind, queue wait, memory)."""
    latencies = [c.latency_s for c in calls]
    waits = [c.queue_wait_s for c in calls if c.queue_wait_s is not None]
    count = {kind: sum(1 for c in calls if c.outcome == kind) for kind in Outcome}
    return {
        "scenario": scenario,
        "concurrency": concurrency,
        "p50_s": percentile(latencies, 0.50),
        "p95_s": percentile(latencies, 0.95),
        "max_s": max(latencies),
        "mean_s": statistics.fmean(latencies),
        "throughput_calls_per_s": len(calls) / measured_wall if measured_wall > 0 else 0.0,
        "success_count": count[Outcome.ok],
        "failure_count": len(calls) - count[Outcome.ok],
        "measured_call_count": len(calls),
        "timeout_count": count[Outcome.timeout],
        "client_timeout_count": count[Outcome.client_timeout],
        "error_count": count[Outcome.error],
        "p50_queue_wait_s": percentile(waits, 0.50) if waits else None,
        "p95_queue_wait_s": percentile(waits, 0.95) if waits else None,
        "peak_memory_mb": peak_memory_mb,
        # CPU the load generator's event loop spent per measured call (for `local` this
        # includes the in-process executor's loop work): on a small machine the load
        # generator competes with the system under test, and this says by how much.
        "client_cpu_ms_per_call": 1000 * client_cpu_s / len(calls),
        "measured_wall_s": measured_wall,
        "failure_samples": [c.detail for c in calls if c.detail][:MAX_FAILURE_SAMPLES],
    }
