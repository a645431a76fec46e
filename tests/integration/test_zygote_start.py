"""No request reaches a zygote before its start is done: its hello read and its cgroup settled.

Under cgroup v2 a run group gets its caps' files (`memory.max`, `pids.max`) only once the start
settles the sandbox's group; a request sent while the zygote was still starting found none, and its
run failed as a SandboxError (seen on a v2 host, a sandbox started under a burst of 64 requests)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.script_zygote import ScriptLauncher
from verl_sf.executor.zygote_process import ZygoteProcess

# A zygote slow to say hello, which tells for each request whether it was waiting before the hello left.
SLOW_HELLO = """
time.sleep(1.0)
early = bool(select.select([0], [], [], 0)[0])
def fields(head, lines):
    return {"sent_before_hello": early}
def after_read():
    global early
    early = False
"""


class SettleRecorder:
    """The sandbox's cgroup, as far as a start uses it: no directories, and when it was settled."""

    dirs: dict[str, str] = {}
    procs_files: list[str] = []

    def __init__(self) -> None:
        self.settled = False

    def prepare(self) -> None:
        pass

    def settle(self) -> None:
        self.settled = True


async def _two_requests_during_the_start() -> tuple[list[dict[str, Any]], list[bool]]:
    cgroup = SettleRecorder()
    zygote = ZygoteProcess("slow", "stdlib", ScriptLauncher(SLOW_HELLO), cgroup, lambda session, why: None)  # type: ignore[arg-type]
    settled_when_sent: list[bool] = []
    write = zygote._write

    def recording_write(head: Any, body: bytes) -> None:
        settled_when_sent.append(cgroup.settled)
        write(head, body)

    zygote._write = recording_write  # type: ignore[method-assign]
    try:
        first = asyncio.ensure_future(zygote.run({"op": "run", "id": 1}, b"{}"))  # type: ignore[typeddict-item]
        while zygote.process is None:  # its process exists, its hello not yet come
            await asyncio.sleep(0.01)
        second = await zygote.run({"op": "run", "id": 2}, b"{}")  # type: ignore[typeddict-item]
        return [dict(await first), dict(second)], settled_when_sent
    finally:
        await zygote.stop()


def test_a_request_made_while_the_zygote_starts_waits_for_the_start_to_be_done() -> None:
    replies, settled_when_sent = asyncio.run(_two_requests_during_the_start())
    assert [reply["id"] for reply in replies] == [1, 2]
    assert not any(reply["sent_before_hello"] for reply in replies), replies
    assert settled_when_sent == [True, True]
