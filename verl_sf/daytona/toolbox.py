"""The toolbox of a Daytona sandbox, at `{toolboxProxyUrl}/{sandboxId}/...`: processes, process
sessions, files, the working and home directories, interpreter contexts (the interpreter's
websocket is interpreter.py).

Every call is made with the caller's key, which must own the sandbox (else 404, as for one that
does not exist), and acts through the sandbox's box: the guest agent in its session does the
work with the sandbox's own rights.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import secrets
import shlex
import stat
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from aiohttp import BodyPartReader, MultipartWriter, web
from pydantic import Field, StrictBool, StrictInt, StrictStr

from verl_sf.daytona.config import DaytonaConfig
from verl_sf.daytona.control import TOOLBOX, find
from verl_sf.daytona.sandboxes import Command, DaytonaSandbox, DaytonaSandboxes, NotFound, NotStarted, Output, Shell
from verl_sf.daytona.wire import Body, error, http_error, iso, json_body, refused
from verl_sf.e2b.downloads import BUDGET, DownloadsFull, send
from verl_sf.e2b.envd import MALFORMED, buffered_multipart, is_text, part_bytes
from verl_sf.e2b.sandboxes import CommandTimedOut, Context, GuestError, SandboxGone, base64_text
from verl_sf.e2b.sandboxes import Sandbox as Box
from verl_sf.executor import Overloaded
from verl_sf.validation import Environment

VERSION = "v0.0.0-verl-sf"
SHELL = "/bin/sh"
CODE_RUNNERS = {"python": ["python3", "-c"], "javascript": ["node", "-e"]}
GUEST_STATUS = {"not_found": 404, "invalid_argument": 400, "already_exists": 409, "permission_denied": 403,
                "resource_exhausted": 507, "deadline_exceeded": 408}
FILE_CODES = {"not_found": "FILE_NOT_FOUND", "permission_denied": "FILE_ACCESS_DENIED",
              "invalid_argument": "INVALID_FILE_PATH"}
Handler = Callable[[web.Request, DaytonaSandbox, Box], Awaitable[web.StreamResponse]]


class ExecuteRequest(Body):
    command: StrictStr
    cwd: Optional[StrictStr] = None
    envs: Optional[Environment] = None
    timeout: Optional[StrictInt] = Field(default=None, ge=0)


class CodeRunRequest(Body):
    code: StrictStr
    language: Optional[StrictStr] = None
    argv: Optional[list[StrictStr]] = None
    envs: Optional[Environment] = None
    timeout: Optional[StrictInt] = Field(default=None, ge=0)


class CreateSessionRequest(Body):
    session_id: StrictStr = Field(alias="sessionId", min_length=1, max_length=256)


class SessionExecuteRequest(Body):
    command: StrictStr
    run_async: Optional[StrictBool] = Field(default=None, alias="runAsync")
    async_: Optional[StrictBool] = Field(default=None, alias="async")


class DownloadRequest(Body):
    paths: list[StrictStr] = Field(min_length=1)


class UpdateEnvRequest(Body):
    set: Optional[dict[StrictStr, StrictStr]] = None
    unset: Optional[list[StrictStr]] = None
    unset_value_prefix: Optional[StrictStr] = Field(default=None, alias="unsetValuePrefix")


class CreateContextRequest(Body):
    cwd: Optional[StrictStr] = None
    language: Optional[StrictStr] = None


def file_info(entry: dict[str, Any]) -> dict[str, Any]:
    """The guest's entry as Daytona's FileInfo."""
    modified = datetime.datetime.fromtimestamp(entry["mtime_ns"] / 1e9, datetime.timezone.utc).isoformat()
    return {"name": entry["name"], "isDir": entry["type"] == "dir", "size": entry["size"],
            "mode": entry["permissions"], "permissions": f"0{stat.S_IMODE(entry['mode']):o}",
            "owner": entry["owner"], "group": entry["group"], "modTime": modified, "modifiedAt": modified,
            "path": entry["path"]}


def disposition(name: str, path: str) -> str:
    """A part's Content-Disposition naming its path as Daytona's daemon (Go's mime) writes it: quotes
    and backslashes escaped; a path that is not printable ASCII in RFC 2231's `filename*`."""
    if not (path.isascii() and path.isprintable()):
        return f"form-data; name=\"{name}\"; filename*=utf-8''{urllib.parse.quote(path, safe='')}"
    escaped = path.replace("\\", "\\\\").replace('"', '\\"')
    return f'form-data; name="{name}"; filename="{escaped}"'


def shell_script(command: str, state_dir: str) -> str:
    """`command` as the next one of a session's shell: in the directory, with the exported variables,
    the previous command left (kept in `state_dir`), and leaving its own for the next."""
    state = shlex.quote(state_dir)
    return (f"mkdir -p {state} && cd \"$(cat {state}/cwd 2>/dev/null || pwd)\" 2>/dev/null; "
            f"[ -f {state}/env ] && . {state}/env\n"
            f"{command}\n"
            f"__verl_sf_status=$?; pwd > {state}/cwd; export -p > {state}/env; exit $__verl_sf_status")


def _query(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if not value:
        raise http_error(400, f"{name}: query parameter '{name}' is required")
    return value


class Toolbox:
    def __init__(self, sandboxes: DaytonaSandboxes, config: DaytonaConfig):
        self.sandboxes = sandboxes
        self.boxes = sandboxes.boxes
        self.config = config

        self.interpreter: Optional[Handler] = None

    def add_interpreter(self, handler: Handler) -> None:
        """The interpreter's websocket route (interpreter.py)."""
        self.interpreter = handler

    def add_routes(self, app: web.Application) -> None:
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/version", self.version), ("GET", "/work-dir", self.home), ("GET", "/user-home-dir", self.home),
            ("POST", "/process/execute", self.execute), ("POST", "/process/code-run", self.code_run),
            ("POST", "/process/session", self.create_session), ("GET", "/process/session", self.list_sessions),
            ("GET", "/process/session/{session}", self.get_session),
            ("DELETE", "/process/session/{session}", self.delete_session),
            ("POST", "/process/session/{session}/exec", self.session_execute),
            ("GET", "/process/session/{session}/command/{command}", self.get_command),
            ("GET", "/process/session/{session}/command/{command}/logs", self.command_logs),
            ("GET", "/files", self.list_files), ("DELETE", "/files", self.delete_file),
            ("GET", "/files/info", self.file_info), ("POST", "/files/folder", self.create_folder),
            ("POST", "/files/move", self.move), ("POST", "/files/permissions", self.permissions),
            ("POST", "/files/bulk-upload", self.upload), ("POST", "/files/bulk-download", self.bulk_download),
            ("GET", "/files/download", self.download), ("POST", "/env", self.update_env),
            ("POST", "/process/interpreter/context", self.create_context),
            ("GET", "/process/interpreter/context", self.list_contexts),
            ("DELETE", "/process/interpreter/context/{context}", self.delete_context),
        ]
        if self.interpreter is not None:
            routes.append(("GET", "/process/interpreter/execute", self.interpreter))
        for method, path, handler in routes:
            app.router.add_route(method, f"{TOOLBOX}/{{sandbox}}{path}", self.wrap(handler))
        app.router.add_route("*", f"{TOOLBOX}/{{sandbox}}/{{rest:.*}}", self.wrap(self.unimplemented))

    def wrap(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A toolbox route: the caller's started sandbox, its activity noted, the box's failures answered."""
        async def route(request: web.Request) -> web.StreamResponse:
            sandbox = find(request, self.sandboxes, self.config)
            try:
                box = self.sandboxes.box_of(sandbox)
            except NotStarted as exc:
                return error(409, str(exc))
            with sandbox.in_use():
                try:
                    return await handler(request, sandbox, box)
                except GuestError as exc:
                    return error(GUEST_STATUS.get(exc.code, 500), str(exc), FILE_CODES.get(exc.code))
                except SandboxGone as exc:
                    return self.gone(sandbox, exc)
                except Overloaded as exc:
                    return refused(request, exc, f"server overloaded: {exc}")
        return route

    def gone(self, sandbox: DaytonaSandbox, exc: SandboxGone) -> web.Response:
        """A box that ended during the call: the sandbox was deleted (404) or has stopped (409)."""
        if sandbox.id not in self.sandboxes.all:
            return error(404, str(NotFound(sandbox.id)))
        self.sandboxes.refresh(sandbox)
        return error(409, f"Sandbox {sandbox.id} is not started: {exc.reason}")

    async def unimplemented(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        return error(501, f"{request.method} {request.path.split(sandbox.id, 1)[-1]} is not implemented by verl-sf "
                          f"(docs/daytona.md lists what is)")

    # ---- info --------------------------------------------------------------------------------
    async def version(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        return web.json_response({"version": VERSION})

    async def home(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        """The working directory and the user's home are one: the session's own directory."""
        return web.json_response({"dir": await self.home_of(box)})

    async def home_of(self, box: Box) -> str:
        return str((await self.boxes.call(box, "fs_stat", {"path": ""}))["path"])

    # ---- processes ---------------------------------------------------------------------------
    def _deadline(self, timeout: Optional[int]) -> float:
        return time.monotonic() + (timeout or self.config.run_timeout_s)

    async def run(self, box: Box, cmd: str, args: list[str], envs: dict[str, str], cwd: Optional[str],
                  deadline: float) -> tuple[int, str]:
        """A command to its end: exit code, and stdout then stderr, each kept to the output limit
        (CommandTimedOut at the deadline)."""
        out, err = self._output(), self._output()
        exit_code = -1
        start = {"cmd": cmd, "args": args, "envs": envs, "cwd": cwd or ""}
        async for result in self.boxes.command(box, start, self.config.command_poll_s, deadline):
            out.add(base64.b64decode(result.get("stdout") or ""))
            err.add(base64.b64decode(result.get("stderr") or ""))
            if "end" in result:
                exit_code = int(result["end"]["exit_code"])
        return exit_code, out.text() + err.text()

    def _output(self) -> Output:
        return Output(self.boxes.executor.config.output_limit_bytes)

    def _timed_out(self, limit: Optional[int]) -> web.Response:
        return error(408, f"the command ran past its timeout of {limit or self.config.run_timeout_s:g} s and was "
                          f"killed", code="PROCESS_EXECUTION_TIMEOUT")

    async def execute(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        body = await json_body(request, ExecuteRequest)
        assert isinstance(body, ExecuteRequest)
        try:
            code, output = await self.run(box, SHELL, ["-c", body.command], body.envs or {}, body.cwd,
                                          self._deadline(body.timeout))
        except CommandTimedOut:
            return self._timed_out(body.timeout)
        return web.json_response({"exitCode": code, "result": output})

    async def code_run(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        body = await json_body(request, CodeRunRequest)
        assert isinstance(body, CodeRunRequest)
        language = body.language or sandbox.spec.labels.get("code-toolbox-language", "python")
        runner = CODE_RUNNERS.get(language)
        if runner is None:
            return error(400, f"language: {language!r} is not supported by verl-sf's code-run "
                              f"({', '.join(CODE_RUNNERS)})")
        try:
            code, output = await self.run(box, runner[0], [*runner[1:], body.code, *(body.argv or [])],
                                          body.envs or {}, None, self._deadline(body.timeout))
        except CommandTimedOut:
            return self._timed_out(body.timeout)
        return web.json_response({"exitCode": code, "result": output,
                                  "artifacts": {"charts": []}})

    # ---- process sessions --------------------------------------------------------------------
    def _shell(self, request: web.Request, sandbox: DaytonaSandbox) -> Shell:
        shell = sandbox.shells.get(request.match_info["session"])
        if shell is None:
            raise http_error(404, f"session {request.match_info['session']} not found")
        return shell

    @staticmethod
    def _session(shell: Shell) -> dict[str, Any]:
        return {"sessionId": shell.id, "commands": [{"id": c.id, "command": c.command, "exitCode": c.exit_code}
                                                    for c in shell.commands.values()]}

    async def create_session(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        body = await json_body(request, CreateSessionRequest)
        assert isinstance(body, CreateSessionRequest)
        if body.session_id in sandbox.shells:
            return error(409, f"session {body.session_id} already exists")
        sandbox.shells[body.session_id] = Shell(body.session_id)
        return web.Response(status=201)

    async def list_sessions(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        return web.json_response([self._session(s) for s in sandbox.shells.values()])

    async def get_session(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        return web.json_response(self._session(self._shell(request, sandbox)))

    async def delete_session(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        shell = self._shell(request, sandbox)
        del sandbox.shells[shell.id]
        with contextlib.suppress(GuestError):
            await self.boxes.call(box, "fs_remove", {"path": shell.state_dir})
        for command in shell.commands.values():  # what still runs goes with its session, as in Daytona
            if command.task is not None and not command.task.done():
                command.task.cancel()
                if command.pid is not None:
                    with contextlib.suppress(GuestError):
                        await self.boxes.call(box, "proc_signal", {"pid": command.pid, "number": 9})
        return web.Response(status=204)

    async def session_execute(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        shell = self._shell(request, sandbox)
        body = await json_body(request, SessionExecuteRequest)
        assert isinstance(body, SessionExecuteRequest)
        command = Command(id=str(uuid.uuid4()), command=body.command, stdout=self._output(), stderr=self._output())
        shell.commands[command.id] = command
        done = asyncio.ensure_future(self._follow(box, command, shell))
        if body.run_async or body.async_:
            command.task = done
            return web.json_response({"cmdId": command.id}, status=202)
        await done
        stdout, stderr = command.stdout.text(), command.stderr.text()
        return web.json_response({"cmdId": command.id, "exitCode": command.exit_code, "output": stdout + stderr,
                                  "stdout": stdout, "stderr": stderr})

    async def _follow(self, box: Box, command: Command, shell: Shell) -> None:
        """Run a session's command, keeping its output as it comes (its logs can be read meanwhile)."""
        start = {"cmd": SHELL, "args": ["-c", shell_script(command.command, shell.state_dir)], "envs": {}, "cwd": ""}
        deadline = self._deadline(None)
        try:
            async for result in self.boxes.command(box, start, self.config.command_poll_s, deadline):
                command.pid = command.pid or result.get("pid")
                command.stdout.add(base64.b64decode(result.get("stdout") or ""))
                command.stderr.add(base64.b64decode(result.get("stderr") or ""))
                if "end" in result:
                    command.exit_code = int(result["end"]["exit_code"])
        except CommandTimedOut:
            command.stderr.add(f"\nkilled: ran past {self.config.run_timeout_s:g} s\n".encode())
            command.exit_code = 137
        except (GuestError, SandboxGone) as exc:
            command.stderr.add(f"\n{exc}\n".encode())
            command.exit_code = -1

    def _command(self, request: web.Request, sandbox: DaytonaSandbox) -> Command:
        command = self._shell(request, sandbox).commands.get(request.match_info["command"])
        if command is None:
            raise http_error(404, f"command {request.match_info['command']} not found")
        return command

    async def get_command(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        command = self._command(request, sandbox)
        return web.json_response({"id": command.id, "command": command.command, "exitCode": command.exit_code})

    async def command_logs(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        command = self._command(request, sandbox)
        if request.query.get("follow") == "true":
            return error(501, "follow: streaming a command's logs is not implemented by verl-sf (poll without it)")
        stdout, stderr = command.stdout.text(), command.stderr.text()
        return web.json_response({"output": stdout + stderr, "stdout": stdout, "stderr": stderr})

    # ---- files -------------------------------------------------------------------------------
    async def list_files(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        depth = request.query.get("depth", "1")
        if not depth.isdigit() or int(depth) < 1:
            return error(400, "depth: must be an integer >= 1")
        entries = await self.boxes.call(box, "fs_list", {"path": request.query.get("path", ""), "depth": int(depth)})
        return web.json_response([file_info(e) for e in entries])

    async def file_info(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        return web.json_response(file_info(await self.boxes.call(box, "fs_stat", {"path": _query(request, "path")})))

    async def delete_file(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        recursive = request.query.get("recursive", "false").lower() == "true"
        await self.boxes.call(box, "fs_remove", {"path": _query(request, "path"), "recursive": recursive})
        return web.Response(status=204)

    async def create_folder(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        path, mode = _query(request, "path"), request.query.get("mode", "")
        await self.boxes.call(box, "fs_make_dir", {"path": path})
        if mode:
            await self.boxes.call(box, "fs_chmod", {"path": path, "mode": mode, "owner": "", "group": ""})
        return web.Response(status=201)

    async def move(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        await self.boxes.call(box, "fs_move", {"source": _query(request, "source"),
                                               "destination": _query(request, "destination")})
        return web.Response(status=200)

    async def permissions(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        await self.boxes.call(box, "fs_chmod", {"path": _query(request, "path"), "mode": request.query.get("mode", ""),
                                                "owner": request.query.get("owner", ""),
                                                "group": request.query.get("group", "")})
        return web.Response(status=200)

    async def upload(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        """Multipart `files[i].path` (text) and `files[i].file` (the bytes; with no path part, its filename
        is the path), as Daytona's daemon takes them: each file that can be is written, whole or not at
        all; 200 `{"files": [{"path", "bytes"}]}`, else 400 `{"errors": [...], "files": [those written]}`
        (the SDK shows `errors`)."""
        if not request.content_type.startswith("multipart/"):
            return error(400, "the body must be multipart/form-data with files[i].path and files[i].file parts")
        paths: dict[str, str] = {}
        data: dict[str, tuple[bytes, Optional[str]]] = {}
        try:
            reader = await buffered_multipart(request)
            while True:
                part = await reader.next()
                if part is None:
                    break
                if not isinstance(part, BodyPartReader) or not part.name:
                    continue
                index, _, field = part.name.rpartition(".")
                if field == "path":
                    paths[index] = (await part_bytes(part)).decode()
                elif field == "file":
                    data[index] = (await part_bytes(part), part.filename)
        except MALFORMED as exc:
            return error(400, f"the upload is malformed: {exc}")
        if not data:
            return error(400, "files: no file in the upload (parts files[i].file)")
        errors: list[str] = []
        written: list[dict[str, Any]] = []
        for index, (content, filename) in data.items():
            number = index.removeprefix("files[").removesuffix("]")
            target = (paths.get(index) or filename or "").strip()
            if not target:
                errors.append(f"file[{number}]: missing .path metadata")
            elif not is_text(target):
                errors.append(f"path[{number}]: {target!r} is not UTF-8 text")
            else:
                try:
                    await self.boxes.call(box, "fs_write", {"path": target}, data=await base64_text(content))
                    written.append({"path": target, "bytes": len(content)})
                except GuestError as exc:
                    errors.append(f"{target}: {exc}")
        if errors:
            return web.json_response({"errors": errors, "files": written, "statusCode": 400,
                                      "message": "; ".join(errors)}, status=400)
        return web.json_response({"files": written})

    async def download(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.StreamResponse:
        content = await self.boxes.read_file(box, _query(request, "path"))
        try:
            return await send(request, content, {"Content-Type": "application/octet-stream"})
        except DownloadsFull as exc:
            return refused(request, exc, str(exc))

    async def bulk_download(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.StreamResponse:
        """A multipart answer: per path, a `file` part with its bytes, or an `error` part saying why; the
        files read are held against the server's download budget as they come (503 past it)."""
        body = await json_body(request, DownloadRequest)
        assert isinstance(body, DownloadRequest)
        writer = MultipartWriter("form-data", boundary=secrets.token_hex(16))
        try:
            with contextlib.ExitStack() as held:
                for path in body.paths:
                    try:
                        content = await self.boxes.read_file(box, path)
                    except GuestError as exc:
                        status = GUEST_STATUS.get(exc.code, 500)
                        failure = {"message": str(exc), "statusCode": status,
                                   "code": FILE_CODES.get(exc.code, "INTERNAL")}
                        writer.append(json.dumps(failure), {"Content-Type": "application/json",
                                                            "Content-Disposition": disposition("error", path)})
                        continue
                    held.enter_context(BUDGET.hold(len(content)))
                    writer.append(content, {"Content-Type": "application/octet-stream",
                                            "Content-Disposition": disposition("file", path)})
                answer = await writer.as_bytes()
            return await send(request, answer, {"Content-Type": f"multipart/form-data; boundary={writer.boundary}"})
        except DownloadsFull as exc:
            return refused(request, exc, str(exc))

    # ---- the environment ---------------------------------------------------------------------
    async def update_env(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        """`sandbox.update_env`: what later commands, sessions and runs see (the sandbox's box keeps it)."""
        body = await json_body(request, UpdateEnvRequest)
        assert isinstance(body, UpdateEnvRequest)
        await self.boxes.call(box, "env_update", {"values": body.set or {}, "unset": body.unset or [],
                                                  "unset_value_prefix": body.unset_value_prefix or ""})
        return web.json_response({})

    # ---- interpreter contexts ----------------------------------------------------------------
    @staticmethod
    def _context(context: Context) -> dict[str, Any]:
        return {"id": context.id, "cwd": context.cwd, "language": context.language, "active": True,
                "createdAt": iso(time.time())}

    async def create_context(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        body = await json_body(request, CreateContextRequest)
        assert isinstance(body, CreateContextRequest)
        if (body.language or "python") != "python":
            return error(400, f"language: {body.language!r} contexts are not supported (python only)")
        context_id = str(uuid.uuid4())
        created = await self.boxes.call(box, "ctx_create", {"context_id": context_id, "cwd": body.cwd or ""})
        box.contexts[context_id] = Context(context_id, "python", created["cwd"])
        return web.json_response(self._context(box.contexts[context_id]))

    async def list_contexts(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        return web.json_response({"contexts": [self._context(c) for c in box.contexts.values()
                                               if c.id != box.default_context]})

    async def delete_context(self, request: web.Request, sandbox: DaytonaSandbox, box: Box) -> web.Response:
        context_id = request.match_info["context"]
        if context_id not in box.contexts or context_id == box.default_context:
            return error(404, f"context {context_id} not found")
        await self.boxes.call(box, "ctx_remove", {"context_id": context_id})
        del box.contexts[context_id]
        return web.Response(status=204)
