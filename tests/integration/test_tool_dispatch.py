"""The tool's default dispatcher (`RayLimiterDispatcher`): calls run in this process under permits of
the cluster-wide limiter, on a real local Ray cluster against a real `verl-sf serve`.

The cap is measured from timestamps the sandboxed code takes itself; "the permit came back"
is shown by the next call running under `rate_limit=1` (it would wait forever otherwise).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from tests.intervals import max_overlap
from tests.ray_fixtures import RayCluster
from tests.server_fixtures import ServerHandle
from tests.waiting import wait_until_async
from verl_sf.backends.http import HttpSandboxBackend
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus
from verl_sf.pool import shutdown_global_limiter
from verl_sf.tools.dispatch import InProcessDispatcher, RayLimiterDispatcher, make_dispatcher

pytestmark = pytest.mark.ray

TIMED_CODE = "import time\nprint(time.time(), flush=True)\ntime.sleep(0.2)\nprint(time.time())"
# A permit that did not come back would make the next call under rate_limit=1 wait forever.
NEXT_CALL_DEADLINE_S = 10.0


@pytest.fixture
def limiter_name(ray_local: RayCluster) -> Iterator[str]:
    """A limiter of the test's own, so tests cannot see each other's permits."""
    name = f"test-tool-limiter-{uuid.uuid4().hex[:8]}"
    yield name
    shutdown_global_limiter(name)


async def limiter_stats(name: str) -> dict[str, Any]:
    return await ray.get_actor(name).stats.remote()


async def sandbox_overlap(pool: Any, server: ServerHandle, calls: int) -> int:
    """Run `calls` timed snippets through `pool`; the deepest overlap seen inside the sandbox."""
    backend = HttpSandboxBackend(server.url)
    request = RunCodeRequest(code=TIMED_CODE, language="python", run_timeout=30)
    try:
        responses: list[RunCodeResponse] = await asyncio.gather(
            *(pool.run(backend.run_code, request) for _ in range(calls)))
    finally:
        await backend.close()
    intervals = []
    for response in responses:
        assert response.status == RunStatus.Success, response
        start, end = (float(line) for line in response.run_result.stdout.split())
        intervals.append((start, end))
    return max_overlap(intervals)


async def ok() -> str:
    return "ok"


async def fail() -> None:
    await asyncio.sleep(0)
    raise KeyError("from fn")


async def test_cap_holds_for_calls_run_in_this_process(limiter_name: str, sf_server: ServerHandle) -> None:
    pool = RayLimiterDispatcher(16, 4, limiter_name=limiter_name)
    try:
        deepest = await sandbox_overlap(pool, sf_server, 64)
    finally:
        await pool.close()
    assert 2 <= deepest <= 4, deepest


async def test_exception_reaches_the_caller_and_the_permit_comes_back(limiter_name: str) -> None:
    pool = RayLimiterDispatcher(2, 1, limiter_name=limiter_name)
    try:
        for _ in range(3):
            with pytest.raises(KeyError, match="from fn"):
                await pool.run(fail)
            assert await asyncio.wait_for(pool.run(ok), NEXT_CALL_DEADLINE_S) == "ok"
    finally:
        await pool.close()


async def test_cancellation_returns_the_permit(limiter_name: str) -> None:
    pool = RayLimiterDispatcher(4, 1, limiter_name=limiter_name)
    try:
        assert await pool.run(ok) == "ok"  # registered; the only permit now idle in this client
        running = asyncio.ensure_future(pool.run(asyncio.sleep, 3600))  # takes it
        queued = asyncio.ensure_future(pool.run(asyncio.sleep, 3600))  # waits for it at the limiter

        async def queued_at_limiter() -> bool:
            return (await limiter_stats(limiter_name))["queue_length"] == 1

        await wait_until_async(queued_at_limiter, 30, "the second call queues at the limiter")
        queued.cancel()  # withdrawn while waiting
        running.cancel()  # cancelled while running: its permit goes back
        for task in (queued, running):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert await asyncio.wait_for(pool.run(ok), NEXT_CALL_DEADLINE_S) == "ok"
        stats = await limiter_stats(limiter_name)
        assert stats["queue_length"] == 0 and stats["in_flight"] <= 1
    finally:
        await pool.close()


async def test_close_returns_the_lease(limiter_name: str) -> None:
    pool = RayLimiterDispatcher(2, 2, limiter_name=limiter_name)
    assert await pool.run(ok) == "ok"
    assert (await limiter_stats(limiter_name))["leases"] == 1
    await pool.close()
    stats = await limiter_stats(limiter_name)
    assert stats["leases"] == 0 and stats["in_flight"] == 0


async def test_a_closed_event_loop_gives_its_permits_back(limiter_name: str) -> None:
    """One tool object, used from a loop that has since closed (another `asyncio.run`): the
    idle permit that loop's client kept is handed back, not held until its lease expires."""
    pool = RayLimiterDispatcher(2, 1, limiter_name=limiter_name)
    try:
        assert await asyncio.to_thread(asyncio.run, pool.run(ok)) == "ok"
        assert await asyncio.wait_for(pool.run(ok), NEXT_CALL_DEADLINE_S) == "ok"

        async def one_lease() -> bool:
            return (await limiter_stats(limiter_name))["leases"] == 1

        await wait_until_async(one_lease, 30, "the closed loop's lease is gone")
    finally:
        await pool.close()


async def test_without_global_rate_limit_only_num_workers_limits(sf_server: ServerHandle,
                                                                  ray_local: RayCluster) -> None:
    pool = make_dispatcher("ray", 4, 1, False)
    assert type(pool) is InProcessDispatcher  # no limiter client at all
    deepest = await sandbox_overlap(pool, sf_server, 16)
    await pool.close()
    assert 2 <= deepest <= 4, deepest  # above rate_limit=1: no limiter was applied


def test_auto_picks_the_limiter_pool_under_ray(ray_local: RayCluster) -> None:
    assert make_dispatcher("auto", 8, 4, True).kind == "ray"
    assert make_dispatcher("ray_actor", 8, 4, True).kind == "ray_actor"
    inprocess = make_dispatcher("inprocess", 8, 4, True)
    assert inprocess.kind == "inprocess" and inprocess.limit == 4
