"""A zygote in-process: it answers the real message types (`zygote/messages.py`) with no sandbox
and no root, so the executor's rooms (admission, sessions, forks) are unit-tested on their own.

`FakeZygote` has the methods of `ZygoteProcess` the rooms call.  Its answers are the zygote's
wire shapes; a test scripts them by setting `run_reply`, `call_reply`, `open_reply` or
`fork_reply` (a reply, or a function of the head), holds requests at `gate` to see what is in
flight, and ends a session unprompted with `end_session`, as the real zygote does when a
session's interpreter dies between calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional, Union

from verl_sf.executor.zygote.messages import (
    CallReply,
    FailedReply,
    ForkReply,
    Head,
    RunBody,
    RunHead,
    RunReply,
    SessionCallHead,
    SessionForkHead,
    SessionOpenHead,
    SessionReply,
)
from verl_sf.executor.zygote_process import Closed, Closing, SandboxCrashed

Scripted = Union[object, Callable[[Head], object]]


def finished(stdout: str = "", return_code: int = 0) -> RunReply:
    return {"kind": "run", "id": 0, "status": "Finished", "return_code": return_code, "stdout": stdout,
            "stderr": "", "execution_time": 0.001, "cpu_time": 0.001}


class FakeZygote:
    def __init__(self, name: str = "fake-0", flavor: str = "stdlib",
                 on_session_end: Callable[[int, str], None] = lambda open_id, reason: None):
        self.name = name
        self.flavor = flavor
        self.cgroup = None
        self.process = None
        self.fault = ""
        self.on_session_end = on_session_end
        self.sessions: set[int] = set()
        self.heads: list[Head] = []  # every request, in order
        self.closed: list[int] = []  # sessions closed, in order
        self.interrupted: list[int] = []
        self.gate: Optional[asyncio.Event] = None  # set: runs and calls wait for it before they are answered
        self.crash = False  # the next run or call fails as if the sandbox died
        self.run_reply: Scripted = finished("ok\n")
        self.call_reply: Scripted = lambda head: {**finished("ok\n"), "kind": "call", "session_alive": True}
        self.open_reply: Scripted = lambda head: {"kind": "session", "id": head["id"], "session_alive": True,
                                                  "group": f"s{head['id']}"}
        self.fork_reply: Scripted = self._copies
        self._next_copy = 10_000
        self.in_flight = 0

    @property
    def load(self) -> int:
        return self.in_flight

    async def ensure_started(self) -> None:
        pass

    async def _answer(self, head: Head, scripted: Scripted) -> object:
        self.heads.append(head)
        self.in_flight += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.crash:
                raise SandboxCrashed(f"sandbox {self.name} exited (code -9)")
            reply = scripted(head) if callable(scripted) else scripted
            assert isinstance(reply, dict)
            return {**reply, "id": head["id"]}
        finally:
            self.in_flight -= 1

    async def run(self, head: RunHead, body: bytes) -> Union[RunReply, FailedReply]:
        return await self._answer(head, self.run_reply)

    async def call(self, head: SessionCallHead, body: bytes) -> Union[CallReply, FailedReply]:
        return await self._answer(head, self.call_reply)

    async def open_session(self, head: SessionOpenHead, body: RunBody) -> Union[SessionReply, FailedReply]:
        reply: Union[SessionReply, FailedReply] = await self._answer(head, self.open_reply)
        if reply["kind"] == "session" and reply["session_alive"]:
            self.sessions.add(head["id"])
        return reply

    async def fork_session(self, head: SessionForkHead) -> Union[ForkReply, FailedReply]:
        reply: Union[ForkReply, FailedReply] = await self._answer(head, self.fork_reply)
        if reply["kind"] == "fork":
            self.sessions.update(copy["id"] for copy in reply.get("sessions", []))
        return reply

    def _copies(self, head: Head) -> ForkReply:
        assert head["op"] == "fork"
        return {"kind": "fork", "id": head["id"], "status": "Finished", "session_alive": True,
                "sessions": [{"id": copy, "group": f"s{copy}"} for copy in head["ids"]]}

    def close_session(self, open_id: int) -> Closing[Closed]:
        self.sessions.discard(open_id)
        self.closed.append(open_id)
        future: asyncio.Future[Closed] = asyncio.get_running_loop().create_future()
        future.set_result({"kind": "closed", "id": 0})
        return future

    def interrupt_session(self, open_id: int) -> None:
        self.interrupted.append(open_id)

    def end_session(self, open_id: int, reason: str) -> None:
        """The session died between calls: the zygote says so unprompted."""
        self.sessions.discard(open_id)
        self.on_session_end(open_id, reason)

    async def stop(self) -> None:
        pass


class FakePool:
    """`ZygotePool`'s picking side over fake zygotes, one per flavor asked for."""

    def __init__(self, on_session_end: Callable[[int, str], None] = lambda open_id, reason: None):
        self.zygotes: dict[str, FakeZygote] = {}
        self.on_session_end = on_session_end

    def zygote(self, flavor: str = "stdlib") -> FakeZygote:
        if flavor not in self.zygotes:
            self.zygotes[flavor] = FakeZygote(f"{flavor}-0", flavor, self.on_session_end)
        return self.zygotes[flavor]

    async def pick(self, flavor: str) -> FakeZygote:
        return self.zygote(flavor)

    async def flavor_for(self, code: str) -> str:
        return "stdlib"
