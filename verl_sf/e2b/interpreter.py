"""The code interpreter's API on a sandbox (port 49999): /execute, /contexts, /health.

An execution is one cell of a session `run_jupyter` call: it runs the code in its context through
the guest (so its value, PNG/HTML and errors are shown as Jupyter shows them), which shows last
what it noted (the execution count, which bundle is the execution's result).  The events are
sent once the execution ends: the session answers a call as a whole.
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
from typing import Any, Optional

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError, field_validator

from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.sandboxes import Context, GuestError, Sandbox, Sandboxes, call_code
from verl_sf.executor.zygote.messages import NOTE
from verl_sf.json_body import JsonBodyError, request_json
from verl_sf.models import CellRunResult, RunJupyterResponse, check_text
from verl_sf.off_loop import off_loop
from verl_sf.validation import Environment, first_error

LANGUAGES = ("python",)
MAX_COUNT = 2**31 - 1
UNNOTED = ("the sandbox did not say how this execution ended: code run in it before has altered its interpreter "
           "(deleted builtins, replaced IPython's or the sandbox agent's objects); create a new sandbox")
MIME_FIELDS = {"text/plain": "text", "text/html": "html", "image/png": "png", "text/markdown": "markdown",
               "image/svg+xml": "svg", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
               "application/json": "json", "application/javascript": "javascript"}


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: StrictStr
    context_id: Optional[StrictStr] = None
    language: Optional[StrictStr] = None
    env_vars: Optional[Environment] = None

    _text = field_validator("code")(classmethod(lambda cls, v: check_text(v)))


class CreateContextRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    language: Optional[StrictStr] = None
    cwd: Optional[StrictStr] = None


def _language(name: Optional[str]) -> str:
    language = (name or "python").strip().lower()
    if language not in LANGUAGES:
        raise web.HTTPBadRequest(text=f"language {name!r} is not supported by verl-sf: python only")
    return language


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def result_event(data: dict[str, Any], main: bool) -> dict[str, Any]:
    """A display bundle as E2B's server shows it: the quotes of a string's repr dropped, as it does."""
    event: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        if mime in MIME_FIELDS:
            event[MIME_FIELDS[mime]] = value
        else:
            extra[mime] = value
    text = event.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] == "'":
        event["text"] = text[1:-1]
    event["extra"] = extra
    return event


def error_event(error: dict[str, Any]) -> dict[str, Any]:
    """IPython's error: its name, value and traceback lines (joined by newlines, for reading)."""
    frames = error.get("traceback") or []
    return {"type": "error", "name": str(error.get("ename", "Error")), "value": str(error.get("evalue", "")),
            "traceback": "\n".join(str(frame) for frame in frames)}


def _split_note(cell: CellRunResult) -> tuple[Optional[tuple[int, Optional[int]]], list[dict[str, Any]]]:
    """What the guest noted about the execution (the cell's last bundle), and the bundles the code
    showed before it.  The note is the execution count and the index of the result among those
    bundles; None if absent or malformed (code run in the sandbox before can alter the interpreter
    that notes it)."""
    if not cell.display or NOTE not in cell.display[-1]:
        return None, list(cell.display)
    *shown, last = cell.display
    note = last[NOTE]
    count, main = (note.get("count"), note.get("main")) if isinstance(note, dict) else (None, None)
    if type(count) is not int or not 0 <= count <= MAX_COUNT:
        return None, shown
    return (count, main if type(main) is int and 0 <= main < len(shown) else None), shown


def execution_events(cells: list[CellRunResult], message: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    run = cells[0] if cells else None
    if run is None:
        return [{"type": "error", "name": "ExecutionError", "value": message or "the execution did not run",
                 "traceback": ""}]
    noted, shown = _split_note(run)
    if noted is not None:
        events.append({"type": "number_of_executions", "execution_count": noted[0]})
    if run.stdout:
        events.append({"type": "stdout", "text": run.stdout, "timestamp": _now()})
    if run.stderr:
        events.append({"type": "stderr", "text": run.stderr, "timestamp": _now()})
    for index, data in enumerate(shown):
        events.append(result_event(dict(data), noted is not None and index == noted[1]))
    if run.error:
        events.append(error_event(run.error[0]))
    elif noted is None:
        events.append({"type": "error", "name": "ExecutionError", "value": UNNOTED, "traceback": ""})
    return events


async def run_execution(sandboxes: Sandboxes, sandbox: Sandbox, context_id: str, code: str, envs: dict[str, str],
                        timeout_s: float) -> tuple[list[dict[str, Any]], RunJupyterResponse]:
    """One execution of `code` in a context: its events (E2B's) and the session's answer."""
    cells = [await off_loop(len(code), call_code, "run_cell", {"context": context_id, "code": code, "envs": envs})]
    response = await sandboxes.run_cells(sandbox, cells, timeout_s)
    events = execution_events(response.cells, response.message)
    if response.session_alive is False:
        reason = sandboxes.end_reason(sandbox.id) or response.message
        events = [e for e in events if e["type"] != "error"]
        events.append({"type": "error", "name": "SandboxEnded", "value": f"the sandbox ended: {reason}",
                       "traceback": ""})
    return events, response


class Interpreter:
    def __init__(self, sandboxes: Sandboxes, config: E2BConfig):
        self.sandboxes = sandboxes
        self.config = config

    async def handle(self, request: web.Request, sandbox: Sandbox) -> web.StreamResponse:
        path, method = request.path, request.method
        try:
            if path == "/health" and method == "GET":
                return web.json_response("OK")
            if path == "/execute" and method == "POST":
                return await self.execute(request, sandbox)
            if path == "/contexts" and method == "POST":
                return await self.create_context(request, sandbox)
            if path == "/contexts" and method == "GET":
                return web.json_response([{"id": c.id, "language": c.language, "cwd": c.cwd}
                                          for c in sandbox.contexts.values()])
            match = re.fullmatch(r"/contexts/([^/]+)(/restart)?", path)
            if match and method == "POST" and match.group(2):
                return await self.restart_context(sandbox, match.group(1))
            if match and method == "DELETE" and not match.group(2):
                return await self.remove_context(sandbox, match.group(1))
        except GuestError as exc:
            status = {"not_found": 404, "invalid_argument": 400}.get(exc.code, 500)
            return web.Response(status=status, text=str(exc))
        return web.Response(status=404, text=f"the code interpreter has no {method} {path}")

    async def _body(self, request: web.Request, model: type[Any]) -> Any:
        try:
            body = await request_json(request)
        except JsonBodyError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        if not isinstance(body, dict):
            raise web.HTTPUnprocessableEntity(text="the body must be a JSON object")
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise web.HTTPUnprocessableEntity(text=first_error(exc)) from None

    async def execute(self, request: web.Request, sandbox: Sandbox) -> web.StreamResponse:
        req: ExecuteRequest = await self._body(request, ExecuteRequest)
        if req.context_id and req.language:
            return web.Response(status=400, text="Only one of context_id or language can be provided")
        if req.context_id:
            context = sandbox.contexts.get(req.context_id)
            if context is None:
                return web.Response(status=404, text=f"Context {req.context_id} not found")
            context_id = context.id
        else:
            _language(req.language)
            context_id = sandbox.default_context
        events, _ = await run_execution(self.sandboxes, sandbox, context_id, req.code, req.env_vars or {},
                                        self.config.execute_timeout_s)
        # E2B streams one JSON line per event; every one is known now, so they leave in one body
        # (a write per line cost a system call each, on both ends).
        lines = [json.dumps(event) for event in events] + ['{"type": "end_of_execution"}', ""]
        return web.Response(body="\n".join(lines).encode(), headers={"Content-Type": "application/json"})

    async def create_context(self, request: web.Request, sandbox: Sandbox) -> web.Response:
        req: CreateContextRequest = await self._body(request, CreateContextRequest)
        language = _language(req.language)
        context_id = secrets.token_hex(16)
        created = await self.sandboxes.call(sandbox, "ctx_create", {"context_id": context_id,
                                                                    "cwd": req.cwd or "/home/user"})
        sandbox.contexts[context_id] = Context(context_id, language, created["cwd"])
        return web.json_response({"id": context_id, "language": language, "cwd": created["cwd"]})

    async def restart_context(self, sandbox: Sandbox, context_id: str) -> web.Response:
        if context_id not in sandbox.contexts:
            return web.Response(status=404, text=f"Context {context_id} not found")
        await self.sandboxes.call(sandbox, "ctx_restart", {"context_id": context_id})
        return web.json_response(None)

    async def remove_context(self, sandbox: Sandbox, context_id: str) -> web.Response:
        if context_id not in sandbox.contexts:
            return web.Response(status=404, text=f"Context {context_id} not found")
        if context_id == sandbox.default_context:
            return web.Response(status=400, text="the default context cannot be removed (restart it instead)")
        await self.sandboxes.call(sandbox, "ctx_remove", {"context_id": context_id})
        del sandbox.contexts[context_id]
        return web.json_response(None)

