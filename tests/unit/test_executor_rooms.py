"""The executor's rooms (admission.py, sessions.py, forks.py) over a fake zygote (tests/fake_zygote.py):
caps, refusals, eviction, expiry and forks, with no sandbox and no root."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Optional

import pytest

from tests.fake_zygote import FakePool, FakeZygote, finished
from verl_sf.errors import (
    ForkFailed,
    ForkUnavailable,
    InvalidRequest,
    Overloaded,
    SandboxFailure,
    SessionBusy,
    SessionGone,
    SnapshotGone,
)
from verl_sf.executor import jobs
from verl_sf.executor.admission import Admission
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.forks import Forks
from verl_sf.executor.languages import PreparedSource
from verl_sf.executor.sessions import Sessions
from verl_sf.executor.status import ExecutorStats
from verl_sf.models import RunCodeRequest, RunStatus, SessionCreateRequest, SessionForkRequest

MB = 1 << 20


class FakeCgroups:
    """The server's cgroup as admission reads it: how much all runs and sessions hold."""

    available = True

    def __init__(self, used: int):
        self.used = used

    def memory_usage(self) -> Optional[int]:
        return self.used


@dataclasses.dataclass
class Rooms:
    config: ExecutorConfig
    stats: ExecutorStats
    admission: Admission
    sessions: Sessions
    forks: Forks
    pool: FakePool

    @property
    def zygote(self) -> FakeZygote:
        return self.pool.zygote()

    async def open(self, language: str = "python", idle_ttl_s: Optional[float] = None) -> str:
        info = await self.sessions.create(SessionCreateRequest(language=language, idle_ttl_s=idle_ttl_s), False,
                                          False)
        return info.session_id


def rooms(**settings: Any) -> Rooms:
    config = dataclasses.replace(ExecutorConfig(slots=4, max_in_flight=8, runs_memory_mb=1000), **settings)
    stats = ExecutorStats()
    admission = Admission(config, stats, lambda memory_mb: sessions.make_room(memory_mb))
    sessions = Sessions(config, stats, admission)
    forks = Forks(config, admission, sessions)
    forks.refusal = ""
    pool = FakePool(lambda open_id, reason: (sessions.died(open_id, reason), forks.died(open_id, reason)))
    sessions.pool = pool
    return Rooms(config, stats, admission, sessions, forks, pool)


def run_job(config: ExecutorConfig, memory_mb: int = 100) -> jobs.JobRequest:
    request = RunCodeRequest(code="print(1)", language="python")
    return jobs.run_job(request, PreparedSource("main.py", "print(1)"), ["python3", "main.py"], None, config,
                        memory_mb, fast_path=True)


# ---- admission ------------------------------------------------------------------------------

async def test_runs_past_max_in_flight_are_refused_and_counted_and_the_rest_run() -> None:
    r = rooms(max_in_flight=2)
    r.zygote.gate = asyncio.Event()
    running = [asyncio.create_task(r.admission.run(r.pool, "stdlib", run_job(r.config), time.monotonic()))
               for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match=r"2 runs in flight \(max_in_flight=2\)"):
        await r.admission.run(r.pool, "stdlib", run_job(r.config), time.monotonic())
    assert r.stats.rejected == 1 and r.stats.in_flight == 2
    r.zygote.gate.set()
    replies = await asyncio.gather(*running)
    assert [reply["kind"] for reply, _ in replies] == ["run", "run"]
    assert r.stats.in_flight == 0 and r.admission.slots.waiting == 0


async def test_a_cancelled_run_gives_its_place_and_slot_back_and_is_counted() -> None:
    r = rooms(slots=1)
    r.zygote.gate = asyncio.Event()
    task = asyncio.create_task(r.admission.run(r.pool, "stdlib", run_job(r.config), time.monotonic()))
    while not r.zygote.in_flight:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (r.stats.in_flight, r.stats.cancelled) == (0, 1)
    r.zygote.gate.set()
    reply, _ = await r.admission.run(r.pool, "stdlib", run_job(r.config), time.monotonic())
    assert reply["kind"] == "run", "the slot came back"


async def test_a_crashed_sandbox_leaves_nothing_held() -> None:
    r = rooms()
    r.zygote.crash = True
    with pytest.raises(Exception, match="exited"):
        await r.admission.run(r.pool, "stdlib", run_job(r.config), time.monotonic())
    assert r.stats.in_flight == 0 and r.admission.slots.waiting == 0


@pytest.mark.parametrize(("used_mb", "run_mb", "idle_mb", "evicted"), [
    (100, 100, [50, 50], 0),  # room enough: nobody goes
    (900, 200, [60, 60, 60], 2),  # 150 MB short of room (a run counts a quarter of the cap at most): two go
    (990, 2000, [300, 300], 1),  # one is enough
    (999, 250, [0, 0], 0),  # ending them all would not make the room: none is ended for nothing, the run runs
    (990, 250, [1, 1, 300], 3),  # room only with the third: the longest idle go first, as far as needed
])
async def test_memory_near_the_cap_evicts_the_longest_idle_sessions_until_the_run_fits(
        used_mb: int, run_mb: int, idle_mb: list[int], evicted: int, monkeypatch: pytest.MonkeyPatch) -> None:
    r = rooms()
    ids = [await r.open() for _ in idle_mb]
    for index, session_id in enumerate(ids):  # the first opened is the longest idle
        r.sessions.table.live[session_id].idle_since = 1000.0 + index
    held = {r.sessions.table.live[s].open_id: mb * MB for s, mb in zip(ids, idle_mb, strict=True)}
    monkeypatch.setattr(Sessions, "_memory", staticmethod(lambda session: held[session.open_id]))
    r.admission.cgroups = FakeCgroups(used_mb * MB)
    reply, _ = await r.admission.run(r.pool, "stdlib", run_job(r.config, run_mb), time.monotonic())
    assert reply["kind"] == "run"
    assert [s for s in ids if s not in r.sessions.table.live] == ids[:evicted]
    for gone in ids[:evicted]:
        with pytest.raises(SessionGone, match="evicted: its memory"):
            r.sessions.table.get(gone)


async def test_a_session_call_never_evicts_its_own_session() -> None:
    r = rooms()
    own = await r.open()
    r.admission.cgroups = FakeCgroups(1000 * MB)
    response = await r.sessions.run_code(RunCodeRequest(code="x", language="python", session_id=own))
    assert response.status == RunStatus.Success and own in r.sessions.table.live


async def test_over_nine_tenths_of_the_memory_cap_no_session_is_made_by_a_fork() -> None:
    r = rooms()
    source = await r.open()
    r.admission.cgroups = FakeCgroups(901 * MB)
    with pytest.raises(Overloaded, match="hold 901 MB of the server's cap of 1000 MB"):
        await r.forks.fork_session(source, SessionForkRequest(count=1))
    assert r.stats.rejected == 1 and len(r.sessions.table) == 1


# ---- sessions -------------------------------------------------------------------------------

async def test_at_max_sessions_the_longest_idle_is_evicted_and_when_all_are_busy_it_is_a_503() -> None:
    r = rooms(max_sessions=2)
    first, second = await r.open(), await r.open()
    r.sessions.table.live[first].idle_since = 1.0
    third = await r.open()
    assert set(r.sessions.table.live) == {second, third}
    with pytest.raises(SessionGone, match="cap of 2 live sessions was reached and it was the longest idle"):
        r.sessions.table.get(first)
    for session_id in (second, third):
        await r.sessions.table.live[session_id].busy.acquire()
    with pytest.raises(Overloaded, match="2 live sessions"):
        await r.open()
    assert r.stats.rejected == 1 and r.zygote.closed == [r.zygote.heads[0]["id"]]


@pytest.mark.parametrize(("reply", "files", "error", "message"), [
    ({"kind": "failed", "error": "could not fork"}, {}, SandboxFailure, "the session could not start: could not fork"),
    ({"kind": "session", "session_alive": False, "session_end": "exited with 1"}, {"a": "eA=="}, InvalidRequest,
     "the session could not start: exited with 1"),
    ({"kind": "session", "session_alive": False, "session_end": "clone: EAGAIN"}, {}, SandboxFailure,
     "the session could not start: clone: EAGAIN"),
])
async def test_a_session_that_does_not_start_blames_its_files_only_if_it_had_some_and_is_not_recorded(
        reply: dict[str, Any], files: dict[str, str], error: type[Exception], message: str) -> None:
    r = rooms()
    r.zygote.open_reply = reply
    with pytest.raises(error, match=message) as caught:
        await r.sessions.create(SessionCreateRequest(files=files), False, False)
    assert getattr(caught.value, "field", None) == ("files" if files else None)
    assert len(r.sessions.table) == 0 and r.sessions.table.opening == 0


async def test_a_call_that_ends_its_session_forgets_it_and_says_why() -> None:
    r = rooms()
    session_id = await r.open()
    r.zygote.call_reply = {**finished(), "kind": "call", "session_alive": False, "session_end": "killed for memory"}
    response = await r.sessions.run_code(RunCodeRequest(code="x", language="python", session_id=session_id))
    assert response.session_alive is False and "the session ended: killed for memory" in response.message
    assert r.stats.sessions_killed == 1
    with pytest.raises(SessionGone, match="killed for memory"):
        r.sessions.table.get(session_id)


async def test_a_session_whose_sandbox_crashes_in_a_call_is_gone_and_its_lock_free() -> None:
    r = rooms()
    session_id = await r.open()
    r.zygote.crash = True
    with pytest.raises(SessionGone, match="its sandbox crashed"):
        await r.sessions.run_code(RunCodeRequest(code="x", language="python", session_id=session_id))
    assert not r.sessions.table.live[session_id].busy.locked() and r.stats.in_flight == 0


async def test_a_call_refused_for_overload_leaves_the_session_free_for_the_next() -> None:
    r = rooms(max_in_flight=0)
    session_id = await r.open()
    with pytest.raises(Overloaded):
        await r.sessions.run_code(RunCodeRequest(code="x", language="python", session_id=session_id))
    assert not r.sessions.table.live[session_id].busy.locked() and r.stats.in_flight == 0


@pytest.mark.parametrize(("request_fields", "field"), [
    ({"language": "bash"}, "language"),
    ({"files": {"a.txt": "eA=="}}, "files"),
])
async def test_a_session_call_that_does_not_fit_the_session_names_its_field(request_fields: dict[str, Any],
                                                                            field: str) -> None:
    r = rooms()
    session_id = await r.open()
    request = RunCodeRequest(**{"code": "x", "language": "python", "session_id": session_id, **request_fields})
    with pytest.raises(InvalidRequest) as caught:
        await r.sessions.run_code(request)
    assert caught.value.field == field and r.zygote.heads[-1]["op"] == "open", "nothing was sent"


@pytest.mark.parametrize(("idle_s", "age_s", "reason"), [
    (5.0, 5.0, None),
    (11.0, 11.0, "expired: idle for 11 s (idle_ttl_s=10)"),
    (1.0, 101.0, "expired: reached the maximum lifetime of 100 s"),
])
async def test_sessions_expire_after_their_idle_ttl_or_the_lifetime(idle_s: float, age_s: float,
                                                                    reason: Optional[str]) -> None:
    r = rooms(session_max_lifetime_s=100.0)
    session_id = await r.open(idle_ttl_s=10.0)
    record = r.sessions.table.live[session_id]
    now = time.time()
    record.idle_since, record.created_at = now - idle_s, now - age_s
    r.sessions.expire(now)
    if reason is None:
        assert session_id in r.sessions.table.live and r.stats.sessions_expired == 0
        return
    assert r.stats.sessions_expired == 1 and r.zygote.closed == [record.open_id]
    with pytest.raises(SessionGone, match=reason.replace("(", r"\(").replace(")", r"\)")):
        r.sessions.table.get(session_id)


async def test_a_session_in_a_call_never_expires() -> None:
    r = rooms()
    session_id = await r.open(idle_ttl_s=1.0)
    record = r.sessions.table.live[session_id]
    record.idle_since = 0.0
    async with record.busy:
        r.sessions.expire(time.time())
    assert session_id in r.sessions.table.live


async def test_a_session_that_dies_between_calls_is_gone_with_the_zygote_s_reason() -> None:
    r = rooms()
    session_id = await r.open()
    r.zygote.end_session(r.sessions.table.live[session_id].open_id, "its interpreter exited")
    assert r.stats.sessions_killed == 1
    with pytest.raises(SessionGone, match="its interpreter exited"):
        r.sessions.table.get(session_id)


# ---- forks and snapshots ------------------------------------------------------------------------

async def test_forks_are_refused_where_the_rung_cannot_fork() -> None:
    r = rooms()
    source = await r.open()
    r.forks.refusal = "forks and snapshots need the namespaces isolation rung"
    with pytest.raises(ForkUnavailable, match="namespaces isolation rung"):
        await r.forks.fork_session(source, SessionForkRequest())


async def test_a_fork_makes_sessions_that_inherit_the_source_s_settings() -> None:
    r = rooms()
    source = await r.open(idle_ttl_s=42.0)
    forked = await r.forks.fork_session(source, SessionForkRequest(count=3))
    assert len(forked.session_ids) == 3 and len(r.sessions.table) == 4
    for copy in forked.session_ids:
        record = r.sessions.table.live[copy]
        assert record.idle_ttl_s == 42.0 and record.group == f"s{record.open_id}" and record.open_id in r.zygote.sessions
    assert [head["op"] for head in r.zygote.heads] == ["open", "call", "fork"], "the collector is frozen first"
    assert r.stats.sessions_created == 4 and r.sessions.table.opening == 0


@pytest.mark.parametrize(("reply", "error", "message"), [
    ({"kind": "fork", "status": "Error", "session_alive": True, "busy": True, "error": "threads run"},
     SessionBusy, "threads run"),
    ({"kind": "fork", "status": "Error", "session_alive": False, "error": "it ended"}, SessionGone, "it ended"),
    ({"kind": "fork", "status": "Error", "session_alive": True, "error": "no memory"}, ForkFailed, "no memory"),
    ({"kind": "failed", "error": "zygote error"}, ForkFailed, "zygote error"),
])
async def test_a_fork_the_zygote_refuses_raises_what_the_reply_says_and_leaves_no_session(
        reply: dict[str, Any], error: type[Exception], message: str) -> None:
    r = rooms()
    source = await r.open()
    r.zygote.fork_reply = reply
    with pytest.raises(error, match=message):
        await r.forks.fork_session(source, SessionForkRequest(count=2))
    assert list(r.sessions.table.live) == [source] and r.sessions.table.opening == 0


async def test_a_session_in_a_call_is_not_forked() -> None:
    r = rooms()
    source = await r.open()
    async with r.sessions.table.live[source].busy:
        with pytest.raises(SessionBusy, match="a call is running in it"):
            await r.forks.fork_session(source, SessionForkRequest())


async def test_a_fork_whose_reseed_fails_ends_every_copy() -> None:
    r = rooms()
    source = await r.open()
    calls = 0

    def call_reply(head: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1  # the freeze passes; the copies' reseed fails
        return {**finished(return_code=0 if calls == 1 else 1), "kind": "call", "session_alive": True,
                "stderr": "no random"}
    r.zygote.call_reply = call_reply
    with pytest.raises(ForkFailed, match="reseeding a fork failed: no random"):
        await r.forks.fork_session(source, SessionForkRequest(count=2, reseed=True))
    assert list(r.sessions.table.live) == [source] and len(r.zygote.closed) == 2


async def test_snapshots_are_capped_expire_and_sessions_start_from_them() -> None:
    r = rooms(max_snapshots=1, snapshot_ttl_s=60.0)
    source = await r.open()
    snapshot = await r.forks.snapshot_session(source)
    with pytest.raises(Overloaded, match="1 snapshots kept"):
        await r.forks.snapshot_session(source)
    started = await r.forks.start_from(SessionCreateRequest(from_snapshot=snapshot.snapshot_id))
    assert started.session_id in r.sessions.table.live and r.forks.info(snapshot.snapshot_id).sessions_started == 1
    with pytest.raises(InvalidRequest, match="runs python, not bash") as caught:
        await r.forks.start_from(SessionCreateRequest(from_snapshot=snapshot.snapshot_id, language="bash"))
    assert caught.value.field == "language"
    r.forks.expire(time.time() + 61.0)
    assert len(r.forks.snapshots) == 0
    with pytest.raises(Exception, match="expired: kept for its TTL of 60 s"):
        r.forks.snapshots.get(snapshot.snapshot_id)


async def test_a_call_the_sandbox_failed_closes_the_session_and_is_a_sandbox_error() -> None:
    r = rooms()
    session_id = await r.open()
    r.zygote.call_reply = {"kind": "failed", "error": "verl-sf zygote error: KeyError"}
    response = await r.sessions.run_code(RunCodeRequest(code="x", language="python", session_id=session_id))
    assert response.status == RunStatus.SandboxError and response.session_alive is False
    assert r.zygote.closed == [r.zygote.heads[0]["id"]]
    with pytest.raises(SessionGone, match="the sandbox failed the call"):
        r.sessions.table.get(session_id)


# ---- races with a session's end ------------------------------------------------------------------

async def test_a_call_queued_behind_one_that_ended_the_session_is_told_why_it_never_ran() -> None:
    r = rooms()
    session_id = await r.open()
    record = r.sessions.table.live[session_id]
    r.zygote.gate = asyncio.Event()
    first = asyncio.create_task(r.sessions.run_code(RunCodeRequest(code="1", language="python",
                                                                   session_id=session_id)))
    while not r.zygote.in_flight:
        await asyncio.sleep(0)
    queued = asyncio.create_task(r.sessions.run_code(RunCodeRequest(code="2", language="python",
                                                                    session_id=session_id)))
    await asyncio.sleep(0)
    r.sessions.end_record(record, "ended by DELETE /sessions")
    r.zygote.gate.set()
    await first
    with pytest.raises(SessionGone, match="ended by DELETE /sessions"):
        await queued
    assert [head["op"] for head in r.zygote.heads].count("call") == 1, "the queued call was never sent"
    assert not record.busy.locked() and r.stats.in_flight == 0


async def test_a_call_the_zygote_found_ended_by_the_server_is_a_404_with_the_server_s_reason() -> None:
    r = rooms()
    session_id = await r.open()
    record = r.sessions.table.live[session_id]

    def ended_meanwhile(head: Any) -> dict[str, Any]:
        r.sessions.table.forget(record, "ended by DELETE /sessions")  # the DELETE won the race to the zygote
        return {"kind": "call", "status": "Error", "session_alive": False, "error": "the session is not running",
                "session_end": "closed"}
    r.zygote.call_reply = ended_meanwhile
    with pytest.raises(SessionGone, match="ended by DELETE /sessions"):
        await r.sessions.run_code(RunCodeRequest(code="1", language="python", session_id=session_id))


async def test_a_call_cut_short_by_the_server_ending_its_session_names_the_server_s_reason() -> None:
    r = rooms()
    session_id = await r.open()
    record = r.sessions.table.live[session_id]

    def killed_meanwhile(head: Any) -> dict[str, Any]:
        r.sessions.table.forget(record, "ended by DELETE /sessions")
        return {**finished(), "kind": "call", "return_code": None, "session_alive": False, "session_end": "closed"}
    r.zygote.call_reply = killed_meanwhile
    response = await r.sessions.run_code(RunCodeRequest(code="1", language="python", session_id=session_id))
    assert response.session_alive is False and "the session ended: ended by DELETE /sessions" in response.message


@pytest.mark.parametrize("from_snapshot", [False, True])
async def test_a_fork_that_lost_the_race_with_its_source_s_end_says_the_source_is_gone(from_snapshot: bool) -> None:
    r = rooms()
    source = await r.open()
    snapshot = (await r.forks.snapshot_session(source)).snapshot_id if from_snapshot else None

    def source_ended(head: Any) -> dict[str, Any]:
        if snapshot is not None:
            r.forks.drop(r.forks.snapshots.live[snapshot], "deleted by DELETE /snapshots")
        else:
            r.sessions.end_record(r.sessions.table.live[source], "ended by DELETE /sessions")
        return {"kind": "fork", "status": "Error", "session_alive": False, "busy": True,
                "error": "the session is not running"}
    r.zygote.fork_reply = source_ended
    if snapshot is not None:
        with pytest.raises(SnapshotGone, match="deleted by DELETE /snapshots"):
            await r.forks.start_from(SessionCreateRequest(from_snapshot=snapshot))
    else:
        with pytest.raises(SessionGone, match="ended by DELETE /sessions"):
            await r.forks.fork_session(source, SessionForkRequest(count=2))
    assert r.sessions.table.opening == 0
