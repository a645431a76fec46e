"""Bursts of slow code (issue #21): what a verl user's reward batch does to a code server.

Unlike the scenarios (batches of one program at a fixed concurrency), a burst is sent once, all
at the same moment, and every call has the deadline verl's reward client gives it: run_timeout +
compile_timeout + 10 s, no retry.  A reply after that deadline is a "client time-out": verl
scores it -1 (API error), a fake zero in the reward.

- loops: `scale` x 100 programs that never end (run_timeout 10) while a stream of `print(6*7)`
  calls runs beside them; reports the short calls' p50/p99 latency during the burst and how many
  loops were answered TimeLimitExceeded in time.
- sleeps: `scale` x 64 x `time.sleep(60)` with run_timeout 5: how many answered in time.
- medium: `scale` x 256 programs of ~0.3 s CPU each from `scale` x 64 clients, run_timeout 10:
  how many come back correct, and the slowest reply.
- bombs: `scale` x 16 fork bombs (run_timeout 5) sent with `scale` x 40 short runs (a sleep of up to
  0.5 s, then `print(6*7)`): how many short runs come back correct, and their p50/p99.  Only on
  backends that bound and end a run's processes (`BenchBackend.bounds_processes`): on the naive
  baseline a fork bomb would take the machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Optional

from bench.backends import BenchBackend
from bench.runner import percentile
from verl_sf.models import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus

LOOP = "while True:\n    pass\n"
SLEEP = "import time\ntime.sleep(60)\n"
SHORT, SHORT_EXPECTED = "print(6 * 7)", "42\n"
# ~0.3 s of CPU wherever it runs: the program counts its own CPU time.
MEDIUM, MEDIUM_EXPECTED = "import time\nwhile time.process_time() < 0.3:\n    pass\nprint('ok')\n", "ok\n"
SHORT_STREAM_CLIENTS = 4
BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


@dataclasses.dataclass
class Reply:
    latency_s: float
    response: Optional[RunCodeResponse]  # None: no answer before the client's deadline, or an error
    error: str = ""


def client_deadline(request: RunCodeRequest) -> float:
    """verl's reward client: run_timeout + compile_timeout + 10 s, then it gives up (-1)."""
    return request.run_timeout + request.compile_timeout + 10


async def timed_call(backend: BenchBackend, request: RunCodeRequest) -> Reply:
    started = time.perf_counter()
    try:
        response = await asyncio.wait_for(backend.run_code(request), client_deadline(request))
        return Reply(time.perf_counter() - started, response)
    except asyncio.TimeoutError:
        return Reply(time.perf_counter() - started, None, "client_timeout")
    except Exception as exc:  # a refused or broken call is counted, not fatal
        return Reply(time.perf_counter() - started, None, f"{type(exc).__name__}: {exc}")


def _timed_out(response: RunCodeResponse) -> bool:
    return response.run_result is not None and response.run_result.status == CommandRunStatus.TimeLimitExceeded


def _printed(expected: str) -> Callable[[RunCodeResponse], bool]:
    def check(response: RunCodeResponse) -> bool:
        return (response.status == RunStatus.Success and response.run_result is not None
                and response.run_result.stdout == expected)
    return check


def _row(name: str, replies: list[Reply], expected: Callable[[RunCodeResponse], bool], wall_s: float) -> dict:
    answered = [r.response for r in replies if r.response is not None]
    return {
        "burst": name,
        "calls": len(replies),
        "answered_in_time": len(answered),
        "expected_verdicts": sum(1 for response in answered if expected(response)),
        "client_timeouts": sum(1 for r in replies if r.error == "client_timeout"),
        "errors": sum(1 for r in replies if r.error and r.error != "client_timeout"),
        "cpu_starved": sum(1 for response in answered if response.run_result and response.run_result.cpu_starved),
        "slowest_reply_s": max(r.latency_s for r in replies),
        "wall_s": wall_s,
        "error_samples": sorted({r.error for r in replies if r.error and r.error != "client_timeout"})[:3],
    }


async def loops(backend: BenchBackend, scale: float) -> dict:
    count = max(1, round(100 * scale))
    loop = RunCodeRequest(code=LOOP, language="python", run_timeout=10)
    short = RunCodeRequest(code=SHORT, language="python", run_timeout=10)
    started = time.perf_counter()
    burst = asyncio.ensure_future(asyncio.gather(*(timed_call(backend, loop) for _ in range(count))))
    shorts: list[Reply] = []

    async def stream() -> None:
        while not burst.done():
            shorts.append(await timed_call(backend, short))

    await asyncio.gather(*(stream() for _ in range(SHORT_STREAM_CLIENTS)))
    row = _row("loops", await burst, _timed_out, time.perf_counter() - started)
    latencies = [r.latency_s for r in shorts]
    row.update(short_calls=len(shorts),
               short_ok=sum(1 for r in shorts if r.response is not None and _printed(SHORT_EXPECTED)(r.response)),
               short_p50_s=percentile(latencies, 0.50), short_p99_s=percentile(latencies, 0.99))
    return row


async def sleeps(backend: BenchBackend, scale: float) -> dict:
    request = RunCodeRequest(code=SLEEP, language="python", run_timeout=5)
    started = time.perf_counter()
    replies = await asyncio.gather(*(timed_call(backend, request) for _ in range(max(1, round(64 * scale)))))
    return _row("sleeps", replies, _timed_out, time.perf_counter() - started)


async def medium(backend: BenchBackend, scale: float) -> dict:
    clients, per_client = max(1, round(64 * scale)), 4
    request = RunCodeRequest(code=MEDIUM, language="python", run_timeout=10)

    async def client() -> list[Reply]:
        return [await timed_call(backend, request) for _ in range(per_client)]

    started = time.perf_counter()
    replies = [reply for batch in await asyncio.gather(*(client() for _ in range(clients))) for reply in batch]
    return _row("medium", replies, _printed(MEDIUM_EXPECTED), time.perf_counter() - started)


async def bombs(backend: BenchBackend, scale: float) -> dict:
    bomb = RunCodeRequest(code=BOMB, language="python", run_timeout=5)
    # Their sleeps spread the short runs over the bombs' first half second, when they fork most.
    shorts = [RunCodeRequest(code=f"import time\ntime.sleep({i % 10 / 20})\n{SHORT}", language="python",
                             run_timeout=10) for i in range(max(1, round(40 * scale)))]
    started = time.perf_counter()
    bomb_replies, short_replies = await asyncio.gather(
        asyncio.gather(*(timed_call(backend, bomb) for _ in range(max(1, round(16 * scale))))),
        asyncio.gather(*(timed_call(backend, short) for short in shorts)))
    row = _row("bombs", bomb_replies, _timed_out, time.perf_counter() - started)
    latencies = [r.latency_s for r in short_replies]
    row.update(short_calls=len(short_replies),
               short_ok=sum(1 for r in short_replies if r.response is not None
                            and _printed(SHORT_EXPECTED)(r.response)),
               short_p50_s=percentile(latencies, 0.50), short_p99_s=percentile(latencies, 0.99))
    return row


BURSTS: dict[str, Callable[[BenchBackend, float], Awaitable[dict]]] = {
    "loops": loops, "sleeps": sleeps, "medium": medium, "bombs": bombs}
NEEDS_BOUNDS = {"bombs"}


def connections_needed(names: list[str], scale: float) -> int:
    """Concurrent calls the bursts make (each needs its own connection, or the client would queue them)."""
    sizes = {"loops": round(100 * scale) + SHORT_STREAM_CLIENTS, "sleeps": round(64 * scale),
             "medium": round(64 * scale), "bombs": round(56 * scale)}
    return max((max(1, sizes[name]) for name in names), default=1)


def terminal_table(label: str, rows: list[dict]) -> str:
    header = (f"{'burst':>8} {'calls':>6} {'in time':>8} {'right':>6} {'late':>5} {'starved':>8} {'slowest':>8} "
              f"{'short p50':>10} {'short p99':>10}")
    lines = [f"\n{label} bursts", header, "-" * len(header)]
    for r in rows:
        p50, p99 = r.get("short_p50_s"), r.get("short_p99_s")
        lines.append(f"{r['burst']:>8} {r['calls']:>6} {r['answered_in_time']:>8} {r['expected_verdicts']:>6} "
                     f"{r['client_timeouts']:>5} {r['cpu_starved']:>8} {r['slowest_reply_s']:>8.2f} "
                     f"{'' if p50 is None else f'{p50:.3f}':>10} {'' if p99 is None else f'{p99:.3f}':>10}")
    return "\n".join(lines)
