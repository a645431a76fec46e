"""`code_interpreter.run_code`: a websocket at `{toolbox}/{sandboxId}/process/interpreter/execute`.

The client sends one JSON request (`code`, `contextId`, `envs`, `timeout` in seconds); the server
runs it in the context (IPython-like cells of the sandbox's session, as E2B's `/execute` does)
and answers `stdout`, `stderr` and `error` frames, then closes with 1000, or with 4008 when the
run passed its time-out (the SDK's DaytonaTimeoutError).  A client that leaves mid-run ends its
wait and interrupts the run, as its time-out would (the context keeps its state).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, Optional

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import Field, StrictInt, StrictStr

from verl_sf.byte_budget import BODIES_KEY, BodiesFull
from verl_sf.daytona.config import DaytonaConfig
from verl_sf.daytona.sandboxes import DaytonaSandbox
from verl_sf.daytona.wire import BadBody, Body, parse
from verl_sf.e2b.interpreter import run_execution
from verl_sf.e2b.sandboxes import Sandbox as Box
from verl_sf.e2b.sandboxes import Sandboxes as Boxes
from verl_sf.e2b.sandboxes import SandboxGone
from verl_sf.errors import SessionGone
from verl_sf.executor import Overloaded
from verl_sf.json_body import JsonBodyError, load_json
from verl_sf.models import MAX_TIMEOUT_S
from verl_sf.off_loop import off_loop
from verl_sf.validation import Environment

TIMED_OUT = 4008  # the SDK's WEBSOCKET_TIMEOUT_CODE
BAD_REQUEST = 4400
UNAVAILABLE = 4503
REQUEST_WAIT_S = 30.0  # how long a client has, once connected, to send its request


class RunRequest(Body):
    code: StrictStr
    context_id: Optional[StrictStr] = Field(default=None, alias="contextId")
    envs: Optional[Environment] = None
    timeout: Optional[StrictInt] = Field(default=None, ge=0)


def frames(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """E2B's execution events as Daytona's frames: output and the error (results are not sent)."""
    out: list[dict[str, Any]] = []
    for event in events:
        if event["type"] in ("stdout", "stderr"):
            out.append({"type": event["type"], "text": event["text"]})
        elif event["type"] == "error":
            out.append({"type": "error", "name": event["name"], "value": event["value"],
                        "traceback": event["traceback"]})
    return out


class InterpreterSocket:
    def __init__(self, boxes: Boxes, config: DaytonaConfig):
        self.boxes = boxes
        self.config = config

    async def execute(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.StreamResponse:
        # A message is capped as a request's body is; not compressed: aiohttp would inflate it on the event loop.
        ws = web.WebSocketResponse(max_msg_size=request.app["max_body_bytes"], compress=False)
        await ws.prepare(request)
        try:
            message = await ws.receive(timeout=REQUEST_WAIT_S)
        except asyncio.TimeoutError:
            await ws.close(code=BAD_REQUEST, message=b"no request within 30 s")
            return ws
        if message.type == WSMsgType.ERROR:  # a frame past aiohttp's message size, say: the client is told
            await ws.close(code=ws.close_code or WSCloseCode.PROTOCOL_ERROR, message=_reason(str(message.data)))
            return ws
        if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return ws  # the client left before asking anything
        try:
            run = parse(RunRequest, await off_loop(len(message.data), load_json, message.data))
        except (JsonBodyError, BadBody) as exc:
            reason = str(exc)
            await ws.close(code=BAD_REQUEST, message=_reason(reason))
            return ws
        assert isinstance(run, RunRequest)
        with contextlib.ExitStack() as held:
            try:  # the message is held as a request's body is, until its answer is sent
                held.enter_context(request.app[BODIES_KEY].hold(len(message.data)))
            except BodiesFull as exc:
                await ws.close(code=UNAVAILABLE, message=_reason(f"server busy: {exc}"))
                return ws
            return await self._answer(ws, run, box)

    async def _answer(self, ws: web.WebSocketResponse, run: RunRequest, box: Box) -> web.WebSocketResponse:
        context_id = run.context_id or box.default_context
        if context_id not in box.contexts:
            await ws.close(code=BAD_REQUEST, message=_reason(f"contextId: context {context_id} not found"))
            return ws
        timeout = run.timeout if run.timeout else (MAX_TIMEOUT_S if run.timeout == 0 else self.config.run_timeout_s)
        execution = asyncio.ensure_future(
            run_execution(self.boxes, box, context_id, run.code, run.envs or {}, min(timeout, MAX_TIMEOUT_S)))
        left = asyncio.ensure_future(ws.receive())  # the client leaving; one request a connection: more are ignored
        try:
            while not execution.done():
                await asyncio.wait({execution, left}, return_when=asyncio.FIRST_COMPLETED)
                if left.done() and not execution.done():
                    if left.result().type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                        break
                    left = asyncio.ensure_future(ws.receive())
        finally:  # the client left (its close, or its connection's loss cancels this handler)
            if not execution.done():
                self._abandon(box, execution)
        if not execution.done():
            return ws
        left.cancel()
        try:
            events, response = execution.result()
        except SandboxGone as exc:
            await ws.close(code=WSCloseCode.GOING_AWAY, message=_reason(f"the sandbox ended: {exc.reason}"))
            return ws
        except Overloaded as exc:
            await ws.close(code=UNAVAILABLE, message=_reason(f"server overloaded: {exc}"))
            return ws
        for frame in frames(events):
            await ws.send_str(json.dumps(frame))
        timed_out = response.driver is not None and response.driver.status.value == "TimeLimitExceeded"
        if timed_out:
            await ws.close(code=TIMED_OUT, message=_reason(f"the execution ran past its timeout of {timeout:g} s"))
        else:
            await ws.close()
        return ws


    def _abandon(self, box: Box, execution: asyncio.Future[Any]) -> None:
        """Nobody waits for the run: it is interrupted, as its time-out would (the context keeps its state)."""
        with contextlib.suppress(SessionGone):
            self.boxes.executor.interrupt_session(box.session_id)
        execution.cancel()


def _reason(text: str) -> bytes:
    return text.encode()[:120]  # a close frame's reason is at most 123 bytes
