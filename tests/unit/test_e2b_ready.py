"""Ready sandboxes (verl_sf/e2b/ready.py): which a create may take, when they are refilled and
when they end, on a stand-in executor (its live sessions, its caps, ending one) and a starter that
counts.  A real server taking them is tests/integration/test_e2b_ready.py."""

from __future__ import annotations

import asyncio
import itertools
import time
import types
from typing import Any, Optional, cast

import pytest

from tests.waiting import wait_until_async
from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.ready import Ready, ReadyBoxes
from verl_sf.errors import CapacityError
from verl_sf.executor import Executor, closed_now


class StandIn:
    def __init__(self, max_sessions: int = 512, lifetime_s: float = 3600.0, in_flight: int = 0) -> None:
        self.sessions: dict[str, Any] = {}
        self.ended: list[str] = []
        self.config = types.SimpleNamespace(max_sessions=max_sessions, session_max_lifetime_s=lifetime_s,
                                            max_in_flight=64)
        self.stats = types.SimpleNamespace(in_flight=in_flight)

    def end_session(self, session_id: str) -> asyncio.Future[Any]:
        self.sessions.pop(session_id, None)
        self.ended.append(session_id)
        return closed_now()


class Starter:
    """Starts ready sandboxes as sessions of the stand-in, `made_at` seconds before now; fails when told."""

    def __init__(self, executor: StandIn, age_s: float = 0.0) -> None:
        self.executor, self.age_s = executor, age_s
        self.numbers = itertools.count()
        self.started: list[tuple[Optional[str], str]] = []
        self.failure: Optional[Exception] = None

    async def __call__(self, home_alias: Optional[str]) -> Ready:
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure
        session_id = f"s{next(self.numbers)}"
        self.executor.sessions[session_id] = object()
        self.started.append((home_alias, session_id))
        return Ready(session_id, f"ctx-{session_id}", time.time() - self.age_s)


def boxes(count: int = 2, ttl_s: float = 300.0, **stand_in: Any) -> tuple[ReadyBoxes, StandIn, Starter]:
    executor = StandIn(**stand_in)
    starter = Starter(executor)
    return ReadyBoxes(cast(Executor, executor), E2BConfig(ready_sandboxes=count, ready_ttl_s=ttl_s), starter), \
        executor, starter


async def filled(ready: ReadyBoxes, count: int) -> None:
    await wait_until_async(lambda: len(ready) == count and not ready._filling, 5, f"{count} ready sandboxes")


async def test_the_first_create_finds_none_and_later_ones_take_the_oldest() -> None:
    ready, _, starter = boxes()
    assert ready.take("/home/user", 300) is None  # nothing is started before a create asks
    await filled(ready, 2)
    assert starter.started == [("/home/user", "s0"), ("/home/user", "s1")]
    taken = ready.take("/home/user", 300)
    assert taken is not None and taken.session_id == "s0" and taken.default_context == "ctx-s0"
    await filled(ready, 2)  # refilled behind it
    assert [session for _, session in starter.started] == ["s0", "s1", "s2"]


async def test_each_home_alias_has_its_own() -> None:
    ready, _, _ = boxes(count=1)
    ready.take("/home/user", 300)
    await filled(ready, 1)
    assert ready.take(None, 300) is None  # Daytona's boxes (no alias) are not E2B's
    await filled(ready, 2)
    taken = ready.take(None, 300)
    assert taken is not None and taken.session_id == "s1"


async def test_a_ready_sandbox_whose_session_ended_is_passed_over() -> None:
    ready, executor, _ = boxes()
    ready.take("/home/user", 300)
    await filled(ready, 2)
    del executor.sessions["s0"]  # evicted while it waited
    taken = ready.take("/home/user", 300)
    assert taken is not None and taken.session_id == "s1"
    await filled(ready, 2)  # s0 was dropped: two are started behind
    assert [r.session_id for r in ready._queues["/home/user"]] == ["s2", "s3"]


async def test_one_too_old_for_the_asked_timeout_is_kept_for_another_create() -> None:
    ready, executor, starter = boxes(lifetime_s=1000.0)
    starter.age_s = 200.0  # started 200 s ago: 800 s of its session's lifetime are left
    ready.take("/home/user", 300)
    await filled(ready, 2)
    assert ready.take("/home/user", 900) is None  # such a create starts its own
    await asyncio.sleep(0.05)
    assert executor.ended == [] and len(ready) == 2 and len(starter.started) == 2  # no churn
    taken = ready.take("/home/user", 790)
    assert taken is not None and taken.session_id == "s0"


async def test_unused_ones_end_after_their_ttl() -> None:
    ready, executor, _ = boxes(ttl_s=60.0)
    ready.take("/home/user", 300)
    await filled(ready, 2)
    ready.expire(time.time() + 30)
    assert len(ready) == 2
    ready.expire(time.time() + 61)
    assert len(ready) == 0 and sorted(executor.ended) == ["s0", "s1"]
    await asyncio.sleep(0.05)
    assert len(ready) == 0  # only a create starts more


@pytest.mark.parametrize("stand_in", [{"max_sessions": 4}, {"in_flight": 31}, {}])
async def test_none_are_started_when_off_or_near_a_cap(stand_in: dict[str, Any]) -> None:
    ready, executor, starter = boxes(count=0 if not stand_in else 2, **stand_in)
    assert ready.take("/home/user", 300) is None
    await asyncio.sleep(0.05)
    assert starter.started == [] and not ready._filling and executor.sessions == {}


async def test_a_failed_start_stops_the_refill_and_the_next_create_tries_again() -> None:
    ready, _, starter = boxes()
    starter.failure = CapacityError("the server's memory cap is near")
    ready.take("/home/user", 300)
    await wait_until_async(lambda: not ready._filling, 5, "the refill gave up")
    assert len(ready) == 0
    starter.failure = None
    assert ready.take("/home/user", 300) is None
    await filled(ready, 2)


async def test_close_ends_every_ready_one() -> None:
    ready, executor, _ = boxes()
    ready.take("/home/user", 300)
    await filled(ready, 2)
    ready.close()
    assert len(ready) == 0 and sorted(executor.ended) == ["s0", "s1"]
