"""E2B's sandboxes and verl-tool's trajectories on the generic live table: what expires, when, and
what a late caller is told (no executor: a stand-in with the sessions it holds)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, cast

import pytest

from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.sandboxes import Ended, Sandbox, Sandboxes, SandboxGone
from verl_sf.executor import Executor, closed_now
from verl_sf.verl_tool.config import VerlToolConfig
from verl_sf.verl_tool.state import ReplayTrajectories, Trajectory

# ---- E2B sandboxes ---------------------------------------------------------------------------


class StandIn:
    """The executor's part a sandbox table reads: its live sessions, and ending one."""

    def __init__(self) -> None:
        self.sessions: dict[str, Any] = {}
        self.ended: list[str] = []
        self.reasons: list[str] = []  # what each ended session's calls were told

    def end_session(self, session_id: str, reason: str = "ended by DELETE /sessions") -> asyncio.Future[Any]:
        self.sessions.pop(session_id, None)
        self.ended.append(session_id)
        self.reasons.append(reason)
        return closed_now()

    def session_end_reason(self, session_id: str) -> Optional[str]:
        return "evicted: the server's cap" if session_id == "session1" else None


def sandboxes_with(*end_ats: float) -> tuple[Sandboxes, StandIn, list[Sandbox]]:
    executor = StandIn()
    sandboxes = Sandboxes(cast(Executor, executor), E2BConfig())
    made = []
    for index, end_at in enumerate(end_ats):
        sandbox = Sandbox(id=f"sbx{index}", session_id=f"session{index}", access_token=f"a{index}",
                          traffic_token=f"t{index}", owner=None, template_id="base", metadata={},
                          started_at=0.0, end_at=end_at, default_context="ctx")
        executor.sessions[sandbox.session_id] = object()
        sandboxes.table.add(sandbox)
        made.append(sandbox)
    return sandboxes, executor, made


@pytest.mark.parametrize(("now", "killed"), [(5.0, []), (10.0, ["sbx0"]), (99.0, ["sbx0", "sbx2"])])
async def test_sandboxes_past_their_timeout_are_killed_saying_so(now: float, killed: list[str]) -> None:
    sandboxes, executor, made = sandboxes_with(10.0, 100.0, 30.0)
    sandboxes.reap(now)
    assert executor.ended == [f"session{sandbox_id[-1]}" for sandbox_id in killed]
    assert executor.reasons == ["its sandbox ended: it reached its timeout"] * len(killed)
    for sandbox in made:
        if sandbox.id in killed:
            with pytest.raises(SandboxGone) as caught:
                sandboxes.get(sandbox.id)
            assert caught.value.reason == "it reached its timeout"
            assert sandboxes.end_reason(sandbox.id) == "it reached its timeout"
            assert sandboxes.record(sandbox.id) == Ended("it reached its timeout", None, sandbox.access_token,
                                                         sandbox.traffic_token)
        else:
            assert sandboxes.get(sandbox.id) is sandbox and sandboxes.end_reason(sandbox.id) is None


async def test_a_sandbox_whose_session_ended_is_gone_saying_so() -> None:
    sandboxes, executor, (first, second) = sandboxes_with(100.0, 100.0)
    del executor.sessions[first.session_id]
    sandboxes._prune()
    assert list(sandboxes.table.live) == [second.id]
    assert sandboxes.end_reason(first.id) == "its session ended"
    del executor.sessions[second.session_id]
    with pytest.raises(SandboxGone, match=r"its session ended \(evicted: the server's cap\)"):  # a lookup too, why
        sandboxes.get(second.id)
    with pytest.raises(SandboxGone, match="no such sandbox"):
        sandboxes.get("sbx-never")
    assert executor.ended == []  # nothing left to kill


async def test_a_kill_keeps_its_reason_and_a_second_is_refused() -> None:
    sandboxes, executor, (sandbox,) = sandboxes_with(100.0)
    await sandboxes.kill(sandbox.id)
    assert executor.ended == [sandbox.session_id] and sandboxes.end_reason(sandbox.id) == "it was killed"
    assert executor.reasons == ["its sandbox ended: it was killed"]
    with pytest.raises(SandboxGone, match="it was killed"):
        sandboxes.kill(sandbox.id, "again")


# ---- verl-tool trajectories ------------------------------------------------------------------

TTL = 60.0
T0 = time.monotonic() + 1e6  # the times below are after it: the real clock a lookup expires by never reaches them


def trajectories() -> ReplayTrajectories:
    return ReplayTrajectories(cast(Executor, None), VerlToolConfig(idle_ttl_s=TTL))


def opened(state: ReplayTrajectories, name: str, last_used: float) -> Trajectory:
    """A new trajectory, last used `last_used` s after T0."""
    trajectory, lost = state._get(("ns", name))
    assert lost is None
    trajectory.last_used = T0 + last_used
    return trajectory


def test_an_idle_trajectory_expires_and_its_next_turn_is_told() -> None:
    state = trajectories()
    old = opened(state, "a", last_used=0.0)
    opened(state, "b", last_used=50.0)
    state._expire(T0 + TTL + 1)
    assert list(state._table.live) == [("ns", "b")]
    trajectory, lost = state._get(("ns", "a"))
    assert trajectory is not old and trajectory.earlier_code == []
    assert lost == f"it had been idle for more than {TTL:g} s"
    assert state._get(("ns", "a"))[1] is None  # told once


def test_an_expired_trajectory_is_remembered_for_one_more_ttl() -> None:
    state = trajectories()
    opened(state, "a", last_used=0.0)
    state._expire(T0 + TTL + 1)
    state._expire(T0 + 2 * TTL + 1)  # within one TTL of its expiry: still remembered
    assert state._table.ended(("ns", "a")) == T0 + TTL + 1
    state._expire(T0 + 2 * TTL + 2)
    assert state._table.ended(("ns", "a")) is None


def test_a_trajectory_in_a_turn_is_kept_and_the_scan_goes_on_past_it() -> None:
    state = trajectories()
    running = opened(state, "a", last_used=0.0)
    opened(state, "b", last_used=1.0)
    asyncio.run(running.lock.acquire())  # uncontended: no loop of its own needed
    state._expire(T0 + TTL + 5)
    assert list(state._table.live) == [("ns", "a")]


def test_the_scan_stops_at_the_first_recently_used() -> None:
    state = trajectories()
    opened(state, "a", last_used=100.0)  # least recently used first: what follows counts as fresh
    opened(state, "b", last_used=0.0)
    state._expire(T0 + TTL + 50)
    assert list(state._table.live) == [("ns", "a"), ("ns", "b")]


async def test_the_finish_signal_forgets_a_trajectory_and_its_expiry() -> None:
    state = trajectories()
    opened(state, "a", last_used=0.0)
    opened(state, "b", last_used=100.0)
    state._expire(T0 + TTL + 1)
    await state.end(("ns", "a"))
    await state.end(("ns", "b"))
    assert state._table.live == {} and state._table.ended(("ns", "a")) is None
    assert state._get(("ns", "a"))[1] is None and state._get(("ns", "b"))[1] is None
