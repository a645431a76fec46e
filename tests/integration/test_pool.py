"""The execution pool and the cluster-wide limiter on a real local Ray cluster.

The cap is checked the hard way: the executed code prints `time.time()` inside the sandbox
when it starts and when it ends, and the intervals must never overlap more than
`rate_limit` deep.  Counting in the limiter would only test the limiter against itself.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from tests.intervals import max_overlap
from tests.pool_helpers import timed_request
from tests.ray_fixtures import RayCluster
from tests.server_fixtures import ServerHandle
from tests.waiting import wait_until_async
from verl_sf.backends.http import HttpSandboxBackend
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus
from verl_sf.pool import (
    ExecutionCrashed,
    ExecutionExited,
    LimiterClient,
    PoolMode,
    init_execution_pool,
    shutdown_global_limiter,
)

pytestmark = pytest.mark.ray

# ---- functions executed by the pool (module level: Ray pickles them by reference) -----------

async def run_in_sandbox(backend: HttpSandboxBackend, request: RunCodeRequest) -> RunCodeResponse:
    return await backend.run_code(request)


def sandbox_interval(response: RunCodeResponse) -> tuple[float, float]:
    assert response.status == RunStatus.Success, response
    start, end = (float(line) for line in response.run_result.stdout.split())
    return start, end


def fail_with(message: str) -> None:
    raise ValueError(message)


async def fail_async(message: str) -> None:
    await asyncio.sleep(0)
    raise KeyError(message)


def started_at() -> float:
    return time.monotonic()


def wait_for_file(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.02)
    return "released"


async def sleep_async(seconds: float) -> None:
    await asyncio.sleep(seconds)


def own_pid() -> int:
    return os.getpid()


def exit_hard(code: int) -> None:
    os._exit(code)


def exit_with(code: int) -> None:
    sys.exit(code)


async def exit_async(code: int) -> None:
    await asyncio.sleep(0)
    raise SystemExit(code)


def interrupt() -> None:
    raise KeyboardInterrupt("by fn")


def fork_then_crash(pid_file: str) -> None:
    pid = os.fork()
    if pid == 0:  # keeps the pool process's ends of its pipes
        time.sleep(300)
        os._exit(0)
    Path(pid_file).write_text(str(pid))
    os._exit(9)


class TwoArguments(Exception):
    def __init__(self, first: int, second: int) -> None:
        super().__init__(f"{first} and {second}")


def raise_two_arguments() -> None:
    raise TwoArguments(1, 2)


def sleep_then_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def return_coroutine(value: int):
    async def later() -> int:
        return value * 2
    return later()


# ---- fixtures ------------------------------------------------------------------------------

@pytest.fixture
def limiter_name(ray_local: RayCluster) -> Iterator[str]:
    """A limiter of the test's own, so tests cannot see each other's permits."""
    name = f"test-limiter-{uuid.uuid4().hex[:8]}"
    yield name
    shutdown_global_limiter(name)


@pytest.fixture
def make_pool(limiter_name: str) -> Iterator[Callable[..., Any]]:
    """init_execution_pool bound to the test's limiter; pools are killed at teardown
    (before the limiter is shut down, so none re-creates it)."""
    pools = []

    def make(num_workers: int = 4, **kwargs: Any):
        kwargs.setdefault("limiter_name", limiter_name)
        pool = init_execution_pool(num_workers, **kwargs)
        pools.append(pool)
        ray.get(pool.start.remote())  # registered with the limiter (creating it if first)
        return pool

    yield make
    for pool in pools:
        ray.kill(pool)


async def limiter_stats(name: str) -> dict[str, Any]:
    return await ray.get_actor(name).stats.remote()


# ---- the cap ---------------------------------------------------------------------------------

async def test_cap_never_exceeded_measured_inside_the_sandbox(make_pool, limiter_name: str,
                                                              sf_server: ServerHandle) -> None:
    backend = HttpSandboxBackend(sf_server.run_code_url)
    # Control: without the limiter the server (4 slots) runs these concurrently, so the
    # measurement below can see a violation when there is one.
    free = make_pool(6, enable_global_rate_limit=False)
    unlimited = await asyncio.gather(*[free.execute.remote(run_in_sandbox, backend, timed_request(1.0))
                                       for _ in range(4)])
    assert max_overlap([sandbox_interval(r) for r in unlimited]) > 2

    # Two pools (two processes, two leases) share one cap of 2.
    pools = [make_pool(6, rate_limit=2), make_pool(6, rate_limit=2)]
    responses = await asyncio.gather(*[pools[i % 2].execute.remote(run_in_sandbox, backend, timed_request(0.4))
                                       for i in range(10)])
    intervals = [sandbox_interval(r) for r in responses]
    assert max_overlap(intervals) <= 2
    # Permits kept idle by the pools go back within IDLE_RETURN_S once nothing runs.
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "idle permits back at the limiter")


async def test_grants_are_fifo_across_pools(make_pool, limiter_name: str) -> None:
    pools = [make_pool(4, rate_limit=1), make_pool(4, rate_limit=1)]
    holder = LimiterClient(rate_limit=1, name=limiter_name)
    permit = await holder.acquire()
    try:
        refs = []
        for i in range(8):  # alternate pools; each request reaches the queue before the next
            refs.append(pools[i % 2].execute.remote(started_at))
            await wait_until_async(lambda i=i: _queue_is(limiter_name, i + 1), 60, f"request {i} queued")
        holder.release(permit)
        starts = await asyncio.gather(*refs)
    finally:
        await holder.close()
    assert starts == sorted(starts), "grants did not follow arrival order"
    stats = await limiter_stats(limiter_name)
    assert stats["wait_s"]["samples"] == 9 and stats["wait_s"]["max"] > 0


async def _queue_is(name: str, length: int) -> bool:
    return (await limiter_stats(name))["queue_length"] == length


# ---- results, exceptions, permits ------------------------------------------------------------

@pytest.mark.parametrize("mode", [PoolMode.ThreadMode, PoolMode.ProcessMode])
async def test_exceptions_reach_the_caller_and_permits_come_back(make_pool, limiter_name: str, mode) -> None:
    pool = make_pool(2, rate_limit=1, mode=mode)
    with pytest.raises(ValueError, match="sync failure 1"):
        await pool.execute.remote(fail_with, "sync failure 1")
    with pytest.raises(KeyError, match="async failure 2"):
        await pool.execute.remote(fail_async, "async failure 2")
    # With a cap of 1, a leaked permit would make these calls wait forever.
    assert await pool.execute.remote(return_coroutine, 21) == 42
    assert await pool.execute.remote(sorted, [3, 1, 2]) == [1, 2, 3]
    stats = await pool.stats.remote()
    assert stats["failed"] == 2 and stats["succeeded"] == 2 and stats["running"] == 0
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "the permit back at the limiter")


async def test_cancellation_returns_the_permit(make_pool, limiter_name: str, tmp_path: Path) -> None:
    pool = make_pool(4, rate_limit=1)
    # An async fn is cancelled at once and its permit returned.
    ref = pool.execute.remote(sleep_async, 300)
    await wait_until_async(lambda: _in_flight_is(limiter_name, 1), 60, "async call running")
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        await ref
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "permit returned after cancel")

    # A sync fn in a thread cannot be interrupted: the permit is held until the thread
    # really finishes (the cap keeps counting running work); then the call ends cancelled.
    signal_file = tmp_path / "go"
    ref = pool.execute.remote(wait_for_file, str(signal_file))
    await wait_until_async(lambda: _in_flight_is(limiter_name, 1), 60, "thread call running")
    ray.cancel(ref)
    await wait_until_async(lambda: _cancel_seen(pool), 60, "cancellation to reach the worker")
    assert (await pool.stats.remote())["running"] == 1
    assert (await limiter_stats(limiter_name))["in_flight"] == 1
    signal_file.touch()
    with pytest.raises(ray.exceptions.TaskCancelledError):
        await ref
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "permit returned when the thread ended")
    assert await pool.execute.remote(sorted, "ba") == ["a", "b"]


@ray.remote
class ToolCaller:
    """An async actor calling tools under the limiter, as verl's agent-loop workers do."""

    def __init__(self, limiter_name: str) -> None:
        self.client = LimiterClient(rate_limit=1, name=limiter_name)
        self.cancelled = False

    async def call_tool_then_generate(self) -> None:
        async with self.client.permit():
            pass
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def call_tool(self) -> str:
        async with self.client.permit():
            return "ran"

    def saw_cancel(self) -> bool:
        return self.cancelled


async def test_cancelling_a_call_leaves_the_limiter_clients_round_trips_alone(limiter_name: str) -> None:
    # Ray cancels with a call every Ray call its asyncio tasks make. The client's long poll
    # starts in the first acquire's call; cancelling that call must not end it, or grants
    # for the process's later calls never arrive.
    holder = LimiterClient(rate_limit=1, name=limiter_name)
    await holder.connect()
    caller = ToolCaller.remote(limiter_name)  # type: ignore[attr-defined]
    try:
        first = caller.call_tool_then_generate.remote()
        await wait_until_async(lambda: _stat_is(limiter_name, "released_total", 1), 60, "the first tool call done")
        ray.cancel(first)
        with pytest.raises(ray.exceptions.TaskCancelledError):
            await first
        await wait_until_async(lambda: caller.saw_cancel.remote(), 60, "the cancel seen by the actor")
        permit = await holder.acquire()
        second = caller.call_tool.remote()
        await wait_until_async(lambda: _queue_is(limiter_name, 1), 60, "the second tool call queued")
        await asyncio.sleep(1)  # the cancel's reach into the call's children, given time to land
        holder.release(permit)
        # Its grant comes by the long poll; without one it waits for ever.
        assert await asyncio.wait_for(_result(second), 45) == "ran"
    finally:
        await holder.close()
        ray.kill(caller)


async def _result(ref: Any) -> Any:
    return await ref


async def _cancel_seen(pool) -> bool:
    return (await pool.stats.remote())["cancelled_waiting_for_thread"] == 1


async def _in_flight_is(name: str, count: int) -> bool:
    return (await limiter_stats(name))["in_flight"] == count


async def test_pool_without_limiter(make_pool, limiter_name: str) -> None:
    pool = make_pool(2, enable_global_rate_limit=False)
    assert await pool.execute.remote(sorted, [2, 1]) == [1, 2]
    with pytest.raises(ValueError, match="no limiter"):
        await pool.execute.remote(fail_with, "no limiter")
    assert "limiter" not in await pool.stats.remote()
    with pytest.raises(ValueError):
        ray.get_actor(limiter_name)  # nothing was created


# ---- process mode ------------------------------------------------------------------------------

async def test_process_mode_runs_in_child_processes_and_survives_crashes(make_pool) -> None:
    pool = make_pool(2, mode=PoolMode.ProcessMode, rate_limit=4)
    actor_pid = (await pool.stats.remote())["pid"]
    child_pid = await pool.execute.remote(own_pid)
    assert child_pid not in (actor_pid, os.getpid())

    # A crash costs only its own call: a call running in the other child completes.
    survivor = pool.execute.remote(sleep_then_pid, 1.0)
    with pytest.raises(ExecutionCrashed, match="exit code 7") as crash:
        await pool.execute.remote(exit_hard, 7)
    crashed_pid = int(re.search(r"pool process (\d+)", str(crash.value)).group(1))
    assert await survivor not in (actor_pid, crashed_pid)
    assert await pool.ping.remote()
    assert await pool.execute.remote(own_pid) not in (actor_pid, crashed_pid)
    stats = await pool.stats.remote()
    assert stats["running"] == 0 and stats["failed"] == 1
    assert crashed_pid not in stats["process_pids"]

    # The children die with the actor (nothing is left behind).
    pids = stats["process_pids"]
    assert pids
    ray.kill(pool)
    await wait_until_async(lambda: _all_gone(pids), 30, "pool processes to exit with their actor")


@pytest.mark.parametrize("mode", [PoolMode.ThreadMode, PoolMode.ProcessMode])
async def test_sys_exit_in_fn_fails_its_call_and_the_pool_goes_on(make_pool, limiter_name: str, mode) -> None:
    """Red team, 2026-12-07: Ray takes a SystemExit raised by an actor's method for the actor's own end;
    fn's `sys.exit()` ended the whole pool, every call in it and, for lease_ttl_s, their permits."""
    pool = make_pool(2, mode=mode, rate_limit=2)
    survivor = pool.execute.remote(sleep_then_pid, 1.0)
    with pytest.raises(ExecutionExited, match=r"exit_with raised SystemExit\(4\)") as exited:
        await pool.execute.remote(exit_with, 4)
    assert exited.value.code == 4
    with pytest.raises(ExecutionExited, match=r"SystemExit\(5\)"):
        await pool.execute.remote(exit_async, 5)
    with pytest.raises(ExecutionExited, match="KeyboardInterrupt"):
        await pool.execute.remote(interrupt)
    assert await survivor > 0
    assert await pool.execute.remote(sorted, "ba") == ["a", "b"]
    assert (await pool.stats.remote())["failed"] == 3
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "the permits back at the limiter")


async def test_a_pool_process_that_forked_and_crashed_fails_its_call_at_once(make_pool, tmp_path: Path) -> None:
    """Red team, 2026-12-07: the call waited for its pipe's end, which the crashed process's fork held:
    for as long as that fork lived (here 300 s)."""
    pool = make_pool(1, mode=PoolMode.ProcessMode, rate_limit=1)
    pid_file = tmp_path / "fork"
    try:
        with pytest.raises(ExecutionCrashed, match="exit code 9"):
            await asyncio.wait_for(_result(pool.execute.remote(fork_then_crash, str(pid_file))), 60)
        assert await pool.execute.remote(sorted, "ba") == ["a", "b"]
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def test_an_exception_that_cannot_be_rebuilt_is_named_in_process_mode(make_pool) -> None:
    """An exception whose pickle cannot be loaded (its __init__ takes other arguments) is named, as
    ThreadMode names it, not replaced by the TypeError of loading it."""
    pool = make_pool(1, mode=PoolMode.ProcessMode, rate_limit=1)
    with pytest.raises(TypeError, match="TwoArguments: 1 and 2"):
        await pool.execute.remote(raise_two_arguments)
    assert await pool.execute.remote(sorted, "ba") == ["a", "b"]


async def _all_gone(pids: list[int]) -> bool:
    return not any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in pids)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


# ---- limiter lifetime and configuration -------------------------------------------------------------

async def test_second_pool_with_another_limit_reconfigures(make_pool, limiter_name: str) -> None:
    first = make_pool(2, rate_limit=2)
    assert (await limiter_stats(limiter_name))["rate_limit"] == 2
    make_pool(2, rate_limit=5)
    stats = (await first.stats.remote())["limiter"]
    assert stats["rate_limit"] == 5 and stats["reconfigurations"] == 1
    # Asking for the same limit again changes nothing.
    make_pool(2, rate_limit=5)
    assert (await limiter_stats(limiter_name))["reconfigurations"] == 1


async def test_limiter_survives_the_pool_that_created_it(make_pool, limiter_name: str) -> None:
    creator = make_pool(2, rate_limit=3, lease_ttl_s=2)  # creates the limiter from inside its actor
    limiter_id = ray.get_actor(limiter_name)._actor_id.hex()
    other = make_pool(2, rate_limit=3)
    ray.kill(creator)
    # The dead pool's lease expires; the limiter itself stays.
    await wait_until_async(lambda: _stat_is(limiter_name, "leases_expired_total", 1), 60, "creator's lease to expire")
    assert ray.get_actor(limiter_name)._actor_id.hex() == limiter_id
    assert await other.execute.remote(sorted, [2, 1]) == [1, 2]


async def _replaced(name: str, old_id: str) -> bool:
    try:
        handle = ray.get_actor(name)
    except ValueError:
        return False
    return handle._actor_id.hex() != old_id and (await handle.stats.remote())["leases"] == 1


async def _stat_is(name: str, key: str, value: Any) -> bool:
    return (await limiter_stats(name))[key] == value


async def test_permit_of_a_killed_caller_is_returned(make_pool, limiter_name: str) -> None:
    doomed = make_pool(2, rate_limit=1, lease_ttl_s=2)
    doomed.execute.remote(sleep_async, 600)
    await wait_until_async(lambda: _in_flight_is(limiter_name, 1), 60, "doomed call to hold the only permit")
    survivor = make_pool(2, rate_limit=1, lease_ttl_s=2)
    waiting = survivor.execute.remote(sorted, [3, 2, 1])
    await wait_until_async(lambda: _queue_is(limiter_name, 1), 60, "survivor to queue behind it")
    ray.kill(doomed)
    assert await waiting == [1, 2, 3]
    assert (await limiter_stats(limiter_name))["reclaimed_total"] == 1
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "every permit back")


async def test_limiter_replaced_after_shutdown_is_rejoined(make_pool, limiter_name: str) -> None:
    pool = make_pool(2, rate_limit=2)
    assert await pool.execute.remote(sorted, [1, 0]) == [0, 1]
    first_id = ray.get_actor(limiter_name)._actor_id.hex()
    assert shutdown_global_limiter(limiter_name)
    # The pool's long-poll fails at once; it registers with a fresh limiter and carries on.
    await wait_until_async(lambda: _replaced(limiter_name, first_id), 60, "the pool to register with a new limiter")
    assert await pool.execute.remote(sorted, [5, 4]) == [4, 5]
    assert (await limiter_stats(limiter_name))["granted_total"] == 1


async def test_idle_permits_are_reused_while_nobody_waits(make_pool, limiter_name: str) -> None:
    pool = make_pool(2, rate_limit=4)
    for i in range(5):
        assert await pool.execute.remote(sorted, [i, -1]) == [-1, i]
    stats = await limiter_stats(limiter_name)
    # One grant served all five calls: the released permit stayed with the pool (no round
    # trips), still counted against the cap, and goes back once unused.
    assert stats["granted_total"] == 1
    await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "the idle permit to go back")
    assert (await limiter_stats(limiter_name))["released_total"] == 1


async def test_close_hands_everything_back(make_pool, limiter_name: str) -> None:
    pool = make_pool(2, mode=PoolMode.ProcessMode, rate_limit=3)
    assert await pool.execute.remote(own_pid) > 0
    stats = await pool.stats.remote()
    assert stats["limiter"]["leases"] == 1 and stats["limiter"]["in_flight"] == 1  # kept idle
    pids = stats["process_pids"]
    await pool.close.remote()
    stats = await limiter_stats(limiter_name)
    assert stats["leases"] == 0 and stats["in_flight"] == 0
    assert await _all_gone(pids)


async def test_a_grant_for_a_request_cancelled_on_its_way_goes_back(limiter_name: str) -> None:
    """Red team, 2026-12-07: the request was withdrawn (a release sent) while the grant was on its way,
    and the grant was then kept as an idle permit the limiter no longer counted: two holders at once
    under a cap of 1."""
    client = LimiterClient(rate_limit=1, name=limiter_name, keep_idle=4)
    try:
        await client.connect()
        cancelled = asyncio.ensure_future(client.acquire())
        for _ in range(3):  # the request leaves in a round trip of its own
            await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await wait_until_async(lambda: _stat_is(limiter_name, "granted_total", 1), 60, "the grant made")
        await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "the grant back at the limiter")
        first = await client.acquire()
        second = asyncio.ensure_future(client.acquire())
        await wait_until_async(lambda: second.done() or _queue_is(limiter_name, 1), 60, "the second request queued")
        assert not second.done(), "two permits held under a cap of 1"
        client.release(first)
        client.release(await asyncio.wait_for(second, 30))
    finally:
        await client.close()


async def test_a_pace_set_later_reaches_the_idle_permits_of_every_pool(make_pool, limiter_name: str) -> None:
    """Red team, 2026-12-07: a pool registered without a pace kept reusing its idle permits after
    another client set one: 40 calls in 0.6 s under requests_per_second=2, one grant counted."""
    pool = make_pool(4, rate_limit=10)
    for _ in range(3):
        assert await pool.execute.remote(sorted, "ba") == ["a", "b"]
    paced = LimiterClient(rate_limit=10, requests_per_second=4, name=limiter_name)
    try:
        await paced.connect()
        await wait_until_async(lambda: _in_flight_is(limiter_name, 0), 60, "the pool's idle permits handed back")
        granted = (await limiter_stats(limiter_name))["granted_total"]
        started = time.monotonic()
        for _ in range(10):
            await pool.execute.remote(sorted, "ba")
        elapsed = time.monotonic() - started
    finally:
        await paced.close()
    assert (await limiter_stats(limiter_name))["granted_total"] - granted == 10  # the bucket saw every call
    assert elapsed >= 1.4, elapsed  # 4 tokens at once, 6 more at 4/s: a lower bound, it cannot flake


async def test_a_faster_pace_is_not_held_up_by_the_slower_ones_refill(limiter_name: str) -> None:
    """Red team, 2026-12-07: the refill timer set for the old pace stood, and requests queued under
    the new one waited for it (here 100 s)."""
    slow = LimiterClient(rate_limit=10, requests_per_second=0.01, name=limiter_name)
    fast = LimiterClient(rate_limit=10, requests_per_second=2, name=limiter_name)
    try:
        slow.release(await slow.acquire())  # the bucket's one token
        waiting = asyncio.ensure_future(slow.acquire())  # its refill is 100 s away at 0.01/s
        await wait_until_async(lambda: _queue_is(limiter_name, 1), 60, "a request waiting for a token")
        await fast.connect()  # the new pace for everyone: two tokens a second
        slow.release(await asyncio.wait_for(waiting, 30))
        for _ in range(3):  # more than a bucket at the new pace holds
            slow.release(await asyncio.wait_for(slow.acquire(), 30))
    finally:
        await slow.close()
        await fast.close()


async def test_a_new_pace_does_not_refill_the_bucket(limiter_name: str) -> None:
    """Red team, 2026-12-07: every change of requests_per_second refilled the bucket, so clients
    registering in turn with two paces let bursts through: 10 grants in one second at 2.5/s."""
    first = LimiterClient(rate_limit=10, requests_per_second=3, name=limiter_name)
    second = LimiterClient(rate_limit=10, requests_per_second=2, name=limiter_name)
    try:
        for _ in range(3):  # the bucket emptied
            first.release(await first.acquire())
        await second.connect()  # 3/s -> 2/s: the tokens carry over, none added
        started = time.monotonic()
        for _ in range(2):
            second.release(await second.acquire())
        elapsed = time.monotonic() - started
    finally:
        await first.close()
        await second.close()
    assert elapsed >= 0.6, elapsed  # two tokens earned at 2/s from an empty bucket: a lower bound


async def test_an_abandoned_client_does_not_register_again(limiter_name: str) -> None:
    """Red team, 2026-12-07: after abandon(), the long poll's LeaseExpired made the client register
    a new lease that nobody polled, held until it expired."""
    client = LimiterClient(rate_limit=1, name=limiter_name)
    client.release(await client.acquire())  # its long poll sent, ahead of the hand-back
    client.abandon()
    await wait_until_async(lambda: _stat_is(limiter_name, "leases", 0), 60, "the lease handed back")
    await asyncio.sleep(1)  # the long poll ended by the hand-back is answered in milliseconds
    assert (await limiter_stats(limiter_name))["leases"] == 0


async def test_a_long_poll_sent_before_a_reply_that_changed_its_view_returns_at_once(limiter_name: str) -> None:
    """Red team, 2026-12-07 (read in the code): a client's poll saying "contended" reached the limiter
    after an update's reply had told the client "not contended", and contention had come back
    meanwhile: the poll waited its whole time-out while the client kept idle permits ahead of the
    queue."""
    holder = LimiterClient(rate_limit=1, name=limiter_name)
    try:
        held = await holder.acquire()
        limiter = ray.get_actor(limiter_name)
        lease = (await limiter.register.remote("a client", 1))["lease"]
        _, contended = await limiter.update.remote(lease, [], [])
        assert contended is False  # what this client was last told
        waiting = asyncio.ensure_future(holder.acquire())  # contention comes back
        await wait_until_async(lambda: _queue_is(limiter_name, 1), 60, "a request queued")
        started = time.monotonic()
        # Sent, say, before the update's reply arrived: the client then still believed "contended".
        grants, contended = await limiter.poll.remote(lease, 20.0, True)
        assert (grants, contended) == ([], True)
        assert time.monotonic() - started < 10  # at once; it waited the whole 20 s before
        holder.release(held)
        holder.release(await asyncio.wait_for(waiting, 30))
        await limiter.unregister.remote(lease)
    finally:
        await holder.close()


class GrantsLost:
    """The limiter's handle, with the reply of the first `method` call that carries a grant lost
    on its way back, as Ray reports one: ActorUnavailableError (the call may or may not have run;
    this one ran)."""

    def __init__(self, handle: Any, method: str) -> None:
        self.handle = handle
        self.method = method
        self.calls = 0
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        if name != self.method:
            return getattr(self.handle, name)
        return self

    def remote(self, *args: Any) -> Any:
        self.calls += 1
        return self._reply(getattr(self.handle, self.method).remote(*args))

    async def _reply(self, ref: Any) -> Any:
        grants, contended = await ref
        if grants and not self.lost:
            self.lost += 1
            raise ray.exceptions.ActorUnavailableError("the reply was lost (injected)", None)
        return grants, contended


async def test_a_grant_whose_reply_was_lost_is_granted_again(limiter_name: str) -> None:
    client = LimiterClient(rate_limit=1, name=limiter_name)
    try:
        await client.connect()
        client._handle = lost = GrantsLost(client._handle, "update")
        permit = await asyncio.wait_for(client.acquire(), 30)  # before, it waited for ever
        assert lost.lost == 1
        assert (await limiter_stats(limiter_name))["in_flight"] == 1
        client.release(permit)
    finally:
        await client.close()
    assert (await limiter_stats(limiter_name))["in_flight"] == 0


async def test_a_grant_whose_long_poll_reply_was_lost_is_granted_again(limiter_name: str) -> None:
    holder = LimiterClient(rate_limit=1, name=limiter_name)
    client = LimiterClient(rate_limit=1, name=limiter_name, lease_ttl_s=3)  # a poll returns within 1 s
    try:
        held = await holder.acquire()
        await client.connect()
        client._handle = lost = GrantsLost(client._handle, "poll")
        await wait_until_async(lambda: lost.calls >= 1, 30, "a long poll through the lossy handle")
        waiter = asyncio.ensure_future(client.acquire())
        await wait_until_async(lambda: _queue_is(limiter_name, 1), 60, "the request queued")
        holder.release(held)  # the grant goes to the waiting client on its long poll
        permit = await asyncio.wait_for(waiter, 30)  # before, it waited for ever
        assert lost.lost == 1
        client.release(permit)
    finally:
        await client.close()
        await holder.close()
    assert (await limiter_stats(limiter_name))["in_flight"] == 0


async def test_requests_per_second_is_a_token_bucket(limiter_name: str) -> None:
    client = LimiterClient(rate_limit=100, requests_per_second=5, name=limiter_name)
    before = time.monotonic()
    try:
        permits = [await client.acquire() for _ in range(15)]
        last_grant = time.monotonic()
        for permit in permits:
            client.release(permit)
        stats = await client.stats()
    finally:
        await client.close()
    # A full bucket holds 5 tokens; the 15th grant needs 10 more at 5/s: >= 2 s after the
    # bucket was filled, which happened after `before`.  (A lower bound: it cannot flake.)
    assert last_grant - before >= 2.0
    assert stats["requests_per_second"] == 5 and stats["granted_total"] == 15


# ---- observability --------------------------------------------------------------------------------

async def test_metrics_are_exported_to_prometheus(make_pool, limiter_name: str, ray_local: RayCluster) -> None:
    pool = make_pool(2, rate_limit=2)
    assert await pool.execute.remote(sorted, [1]) == [1]
    url = f"http://127.0.0.1:{ray_local.metrics_port}/metrics"

    async def scraped() -> str:
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
        lines = [line for line in body.splitlines() if f'limiter="{limiter_name}"' in line]
        text = "\n".join(lines)
        return text if "ray_verl_sf_limiter_rate_limit" in text and "ray_verl_sf_limiter_wait_seconds" in text else ""

    text = await wait_until_async(scraped, 90, "limiter metrics on the Prometheus endpoint")
    for metric in ("permits_in_flight", "queue_length", "leases", "grants_total", "wait_seconds_bucket"):
        assert f"ray_verl_sf_limiter_{metric}" in text
    rate_line = next(line for line in text.splitlines() if line.startswith("ray_verl_sf_limiter_rate_limit{"))
    assert rate_line.endswith(" 2.0")


# ---- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": 0}, r"num_workers\n  Input should be greater than or equal to 1"),
    ({"num_workers": 2, "rate_limit": 0}, r"rate_limit\n  Input should be greater than or equal to 1"),
    ({"num_workers": 2, "rate_limit": 2.5}, r"rate_limit\n  Input should be a valid integer"),
    ({"num_workers": 2, "mode": "Fork"}, "mode must be a PoolMode"),
    ({"num_workers": 2, "requests_per_second": -1}, r"requests_per_second\n  Input should be greater than 0"),
    ({"num_workers": 2, "lease_ttl_s": 7200}, r"lease_ttl_s\n  Input should be less than or equal to 3600"),
])
def test_bad_pool_arguments_are_rejected(ray_local: RayCluster, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        init_execution_pool(**kwargs)


async def test_execute_needs_a_callable(make_pool) -> None:
    pool = make_pool(1, enable_global_rate_limit=False)
    with pytest.raises(TypeError, match="needs a callable"):
        await pool.execute.remote("print(1)")
