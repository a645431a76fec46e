"""The generic table of live things that end (executor/live_table.py), and the executor's session
and snapshot tables on it: ids with the boot tag, what a late request is told, idle order, expiry."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any, Optional, cast

import pytest

from verl_sf.errors import SessionGone, SnapshotGone
from verl_sf.executor.live_table import LiveTable, ZygoteTable
from verl_sf.executor.session_table import SessionRecord, SessionTable
from verl_sf.executor.snapshot_table import Snapshot, SnapshotTable
from verl_sf.executor.zygote_process import ZygoteProcess


@dataclasses.dataclass
class Thing:
    id: str
    deadline: float = 0.0
    open_id: int = 0


def table(ended_kept: Optional[int] = 10) -> LiveTable[str, Thing, str]:
    return LiveTable(lambda thing: thing.id, ended_kept)


def filled(*ids: str, ended_kept: Optional[int] = 10) -> tuple[LiveTable[str, Thing, str], dict[str, Thing]]:
    things = {thing_id: Thing(thing_id) for thing_id in ids}
    made = table(ended_kept)
    for thing in things.values():
        made.add(thing)
    return made, things


# ---- the generic table -----------------------------------------------------------------------

def test_add_forget_and_why_it_ended() -> None:
    made, things = filled("a", "b")
    assert len(made) == 2 and made.live == things
    assert made.forget(things["a"], "killed")
    assert list(made.live) == ["b"] and len(made) == 1
    assert made.ended("a") == "killed"
    assert not made.forget(things["a"], "again")  # gone already: the first reason stays
    assert made.ended("a") == "killed"
    assert made.ended("b") is None and made.ended("never") is None


def test_remove_keeps_nothing() -> None:
    made, things = filled("a")
    assert made.remove(things["a"])
    assert not made.remove(things["a"])
    assert made.live == {} and made.ended("a") is None


@pytest.mark.parametrize(("kept", "ended", "still_told"), [
    (2, ["a", "b", "c"], ["b", "c"]),  # oldest dropped first
    (1, ["a", "b", "c"], ["c"]),
    (0, ["a", "b"], []),
    (5, ["a", "b", "c"], ["a", "b", "c"]),
    (None, ["a", "b", "c", "d"], ["a", "b", "c", "d"]),  # None: kept until dropped
])
def test_ended_reasons_are_bounded(kept: Optional[int], ended: list[str], still_told: list[str]) -> None:
    made, things = filled("a", "b", "c", "d", ended_kept=kept)
    for thing_id in ended:
        made.forget(things[thing_id], f"why {thing_id}")
    assert [thing_id for thing_id in "abcd" if made.ended(thing_id) is not None] == still_told
    assert all(made.ended(thing_id) == f"why {thing_id}" for thing_id in still_told)


def test_drop_ended_and_drop_while() -> None:
    made, things = filled("a", "b", "c", ended_kept=None)
    for thing_id in "abc":
        made.forget(things[thing_id], thing_id)
    assert made.drop_ended("b") == "b" and made.drop_ended("b") is None
    made.drop_ended_while(lambda reason: reason == "a")  # oldest first, while it holds
    assert made.ended("a") is None and made.ended("c") == "c"
    made.drop_ended_while(lambda reason: reason == "a")  # "c" first now: nothing more goes
    assert made.ended("c") == "c"


def test_touch_puts_an_entry_last() -> None:
    made, things = filled("a", "b", "c")
    made.touch(things["a"])
    assert list(made.live) == ["b", "c", "a"]


@pytest.mark.parametrize(("deadlines", "now", "due"), [
    ([1.0, 5.0, 3.0], 0.0, []),
    ([1.0, 5.0, 3.0], 3.0, ["t0", "t2"]),  # at the deadline counts
    ([1.0, 5.0, 3.0], 9.0, ["t0", "t1", "t2"]),
    ([], 9.0, []),
])
def test_due_reads_each_entry(deadlines: list[float], now: float, due: list[str]) -> None:
    made = table()
    for index, deadline in enumerate(deadlines):
        made.add(Thing(f"t{index}", deadline))
    found = made.due(lambda thing: f"past {thing.deadline:g}" if thing.deadline <= now else None)
    assert [thing.id for thing, _ in found] == due
    assert all(reason == f"past {thing.deadline:g}" for thing, reason in found)
    assert len(made) == len(deadlines)  # it only says which: the owner ends them


def test_due_stops_where_told() -> None:
    made = table()
    for index, deadline in enumerate([1.0, 2.0, 8.0, 1.0]):
        made.add(Thing(f"t{index}", deadline))
    found = made.due(lambda thing: "due", stop=lambda thing: thing.deadline > 5.0)
    assert [thing.id for thing, _ in found] == ["t0", "t1"]  # t3 is behind the stop


def test_zygote_table_finds_by_open_id_until_it_ends() -> None:
    made: ZygoteTable[Thing] = ZygoteTable("abc123", 10)
    thing = Thing("x", open_id=7)
    made.add(thing)
    assert made.by_open_id(7) is thing and made.by_open_id(8) is None
    assert made.forget(thing, "died")
    assert made.by_open_id(7) is None and made.ended("x") == "died"
    made.add(thing)
    assert made.remove(thing) and made.by_open_id(7) is None


# ---- sessions --------------------------------------------------------------------------------

def session(table_: SessionTable, idle_since: float = 0.0, created_at: float = 0.0, idle_ttl_s: float = 60.0,
            open_id: int = 1) -> SessionRecord:
    record = SessionRecord(id=table_.new_id(), language="python", zygote=cast(ZygoteProcess, None), open_id=open_id,
                           memory_mb=256, idle_ttl_s=idle_ttl_s, created_at=created_at, idle_since=idle_since)
    table_.add(record)
    return record


def busy(record: Any) -> None:
    asyncio.run(record.busy.acquire())  # uncontended: it takes the lock without a loop of its own


def test_session_ids_carry_the_boot_tag() -> None:
    sessions = SessionTable()
    assert re.fullmatch(r"[0-9a-f]{6}", sessions.boot_tag)
    ids = {sessions.new_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(rf"{sessions.boot_tag}-[0-9a-f]{{16}}", session_id) for session_id in ids)
    assert sessions.opening == 0


def other_tag(tag: str) -> str:
    return "000000" if tag != "000000" else "111111"


@pytest.mark.parametrize(("which", "reason"), [
    ("ended", "ended by DELETE /sessions"),
    ("before a restart", "the server restarted since it was created: sessions do not survive a restart"),
    ("this boot, unknown", "no such session"),
    ("not an id", "no such session"),
])
def test_what_a_late_session_call_is_told(which: str, reason: str) -> None:
    sessions = SessionTable()
    record = session(sessions)
    assert sessions.get(record.id) is record
    sessions.forget(record, "ended by DELETE /sessions")
    session_id = {"ended": record.id,
                  "before a restart": f"{other_tag(sessions.boot_tag)}-{'0' * 16}",
                  "this boot, unknown": f"{sessions.boot_tag}-{'0' * 16}",
                  "not an id": "whatever"}[which]
    with pytest.raises(SessionGone) as caught:
        sessions.get(session_id)
    assert caught.value.reason == reason


def test_idle_is_the_longest_idle_first_and_not_the_busy() -> None:
    sessions = SessionTable()
    middle, latest, earliest, running = (session(sessions, idle_since=t, open_id=t) for t in (5, 9, 1, 0))
    busy(running)
    assert sessions.idle() == [earliest, middle, latest]
    assert sessions.by_open_id(9) is latest


@pytest.mark.parametrize(("idle_since", "created_at", "idle_ttl_s", "is_busy", "reason"), [
    (90.0, 0.0, 60.0, False, None),
    (40.0, 0.0, 60.0, False, None),  # idle exactly its TTL: not yet
    (30.0, 0.0, 60.0, False, "expired: idle for 70 s (idle_ttl_s=60)"),
    (30.0, 0.0, 60.0, True, None),  # in a call: never expired
    (95.0, -10.0, 60.0, False, None),  # exactly the lifetime: not yet
    (95.0, -11.0, 60.0, False, "expired: reached the maximum lifetime of 110 s"),
    (0.0, -500.0, 2.5, False, "expired: idle for 100 s (idle_ttl_s=2.5)"),  # the idle TTL said first
])
def test_session_expiry_and_why(idle_since: float, created_at: float, idle_ttl_s: float, is_busy: bool,
                                reason: Optional[str]) -> None:
    sessions = SessionTable()
    record = session(sessions, idle_since, created_at, idle_ttl_s)
    if is_busy:
        busy(record)
    assert sessions.expired(100.0, 110.0) == ([] if reason is None else [(record, reason)])
    assert sessions.live == {record.id: record}  # told, not ended


def test_expired_sessions_come_longest_idle_first() -> None:
    sessions = SessionTable()
    late, early, fresh = (session(sessions, idle_since=t, idle_ttl_s=10.0, open_id=int(t)) for t in (20, 5, 95))
    assert [record for record, _ in sessions.expired(100.0, 1000.0)] == [early, late]
    assert fresh in sessions.idle()


# ---- snapshots -------------------------------------------------------------------------------

def snapshot(table_: SnapshotTable, expires_at: float, open_id: int = 1) -> Snapshot:
    made = Snapshot(id=table_.new_id(), language="python", zygote=cast(ZygoteProcess, None), open_id=open_id,
                    memory_mb=256, idle_ttl_s=60.0, expires_at=expires_at)
    table_.add(made)
    return made


def test_snapshot_ids_carry_the_sessions_boot_tag() -> None:
    snapshots = SnapshotTable("a1b2c3")
    assert snapshots.boot_tag == "a1b2c3"
    assert re.fullmatch(r"snap-a1b2c3-[0-9a-f]{16}", snapshots.new_id())


@pytest.mark.parametrize(("snapshot_id", "reason"), [
    ("ended", "deleted by DELETE /snapshots"),
    ("snap-ffffff-0000000000000000", "the server restarted since it was taken"),
    ("snap-a1b2c3-0000000000000000", "no such snapshot"),
    ("a1b2c3-0000000000000000", "no such snapshot"),  # a session's id, not a snapshot's
])
def test_what_a_late_snapshot_request_is_told(snapshot_id: str, reason: str) -> None:
    snapshots = SnapshotTable("a1b2c3")
    made = snapshot(snapshots, 100.0)
    assert snapshots.get(made.id) is made
    snapshots.forget(made, "deleted by DELETE /snapshots")
    with pytest.raises(SnapshotGone) as caught:
        snapshots.get(made.id if snapshot_id == "ended" else snapshot_id)
    assert caught.value.reason == reason


@pytest.mark.parametrize(("now", "expired"), [(5.0, []), (10.0, [10.0]), (25.0, [10.0, 20.0])])
def test_snapshots_expire_at_their_time(now: float, expired: list[float]) -> None:
    snapshots = SnapshotTable("a1b2c3")
    for index, expires_at in enumerate([10.0, 30.0, 20.0]):
        snapshot(snapshots, expires_at, open_id=index)
    assert [made.expires_at for made in snapshots.expired(now)] == expired
    assert len(snapshots) == 3
