"""Requests made in one turn of the server's event loop reach the zygote in one write: each write
wakes the zygote, and under load many requests are made per turn."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any, Optional

from verl_sf.executor.zygote_process import ZygoteProcess

# A zygote's side of the protocol, answering each request line with how many lines came in the read
# that carried it.
ECHO_ZYGOTE = r"""
import json, os, sys
os.write(1, b'{"kind": "ready", "id": 0}\n')
pending = b""
while True:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        head = json.loads(line.partition(b"\t")[0])
        reply = {"kind": "run", "id": head["id"], "lines_in_read": len(lines), "order": head["order"]}
        os.write(1, json.dumps(reply).encode() + b"\n")
"""


class EchoLauncher:
    env = dict(os.environ)
    isolated = False  # stopped as on the landlock rung: its requests close, and it exits at their end

    def command(self, name: str, flavor: str, cgroup_fds: dict[str, int], cgroup_v2: bool, config_fd: int) -> list[str]:
        return [sys.executable, "-c", ECHO_ZYGOTE]

    def preexec(self, procs_files: list[str]) -> Optional[Callable[[], None]]:
        return None


def _head(job_id: int, order: int) -> Any:
    return {"op": "run", "id": job_id, "order": order}


async def _requests(count: int) -> list[dict[str, Any]]:
    zygote = ZygoteProcess("echo", "stdlib", EchoLauncher(), None, lambda session, why: None)  # type: ignore[arg-type]
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
