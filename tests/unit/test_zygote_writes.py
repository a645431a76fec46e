"""Requests made in one turn of the server's event loop reach the zygote in one write: each write
wakes the zygote, and under load many requests are made per turn."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.script_zygote import ScriptLauncher
from verl_sf.executor.zygote_process import ZygoteProcess

# Each request answered with how many lines came in the read that carried it.
ECHO = """
def fields(head, lines):
    return {"lines_in_read": len(lines), "order": head["order"]}
def after_read():
    pass
"""


def _head(job_id: int, order: int) -> Any:
    return {"op": "run", "id": job_id, "order": order}


async def _requests(count: int) -> list[dict[str, Any]]:
    zygote = ZygoteProcess("echo", "stdlib", ScriptLauncher(ECHO), None, lambda session, why: None)  # type: ignore[arg-type]
    try:
        replies = await asyncio.gather(*(zygote.run(_head(100 + i, i), b"{}") for i in range(count)))
        return [dict(reply) for reply in replies]
    finally:
        await zygote.stop()


def test_requests_of_one_turn_leave_in_one_write_in_their_order() -> None:
    replies = asyncio.run(_requests(16))
    assert [reply["order"] for reply in replies] == list(range(16))
    assert {reply["lines_in_read"] for reply in replies} == {16}


def test_a_lone_request_leaves_at_once() -> None:
    [reply] = asyncio.run(_requests(1))
    assert reply["lines_in_read"] == 1 and reply["id"] == 100
