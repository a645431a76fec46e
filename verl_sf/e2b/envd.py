"""envd's API on a sandbox (port 49983): /health, /files, and the Filesystem and Process RPCs.

Every call is one or more guest calls in the sandbox's session (see sandboxes.py).  A command
runs as a child of the session: its start and first output come in one call, then it is polled
(`E2BConfig.command_poll_s` per call) while its stream is open, so other calls of the sandbox
interleave with a long command.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import email.message
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from aiohttp import BodyPartReader, MultipartReader, StreamReader, web
from aiohttp.hdrs import CONTENT_DISPOSITION
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from verl_sf.e2b import connect
from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.connect import ConnectError
from verl_sf.e2b.downloads import DownloadsFull, send
from verl_sf.e2b.sandboxes import CommandTimedOut, GuestError, Sandbox, Sandboxes, SandboxGone, base64_text
from verl_sf.errors import answer_of
from verl_sf.off_loop import PIECE_CHARS, off_loop
from verl_sf.validation import Environment, first_error

DEFAULT_RPC_TIMEOUT_S = 60.0
USERS = ("user", "root")  # who a command may run as (root: zygote/root.py)
SIGNALS = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15, 9: 9, 15: 15}
GUEST_HTTP_STATUS = {"not_found": 404, "invalid_argument": 400, "already_exists": 409, "permission_denied": 403,
                     "resource_exhausted": 507, "deadline_exceeded": 504}


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PathRequest(_Message):
    path: str


class ListDirRequest(_Message):
    path: str
    depth: int = Field(default=0, ge=0, le=64)


class MoveRequest(_Message):
    source: str
    destination: str


class ProcessConfig(_Message):
    cmd: str
    args: list[str] = Field(default_factory=list)
    envs: Environment = Field(default_factory=dict)
    cwd: Optional[str] = None


class StartRequest(_Message):
    process: ProcessConfig
    pty: Optional[dict[str, Any]] = None
    tag: Optional[str] = None
    stdin: Optional[bool] = None


class ProcessSelector(_Message):
    pid: Optional[int] = None
    tag: Optional[str] = None


class SendSignalRequest(_Message):
    process: ProcessSelector
    signal: Any = None


def _parse(model: type[Any], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ConnectError("invalid_argument", first_error(exc)) from None


def _entry_info(entry: dict[str, Any]) -> dict[str, Any]:
    """The guest's entry as envd's EntryInfo in proto JSON."""
    seconds, nanos = divmod(int(entry["mtime_ns"]), 1_000_000_000)
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    info = {"name": entry["name"], "type": "FILE_TYPE_DIRECTORY" if entry["type"] == "dir" else "FILE_TYPE_FILE",
            "path": entry["path"], "size": str(entry["size"]), "mode": entry["mode"],
            "permissions": entry["permissions"], "owner": entry["owner"], "group": entry["group"],
            "modifiedTime": f"{stamp}.{nanos:09d}Z", "isSymlink": entry["is_symlink"]}
    if "symlink_target" in entry:
        info["symlinkTarget"] = entry["symlink_target"]
    return info


HOME = "/home/user"  # E2B's home, where relative paths are (guest.HOME_ALIAS)


def _file_named(path: str) -> str:
    """The file an upload path names: relative ones are in the home, as envd resolves them."""
    return posixpath.normpath(posixpath.join(HOME, path))


class Envd:
    def __init__(self, sandboxes: Sandboxes, config: E2BConfig):
        self.sandboxes = sandboxes
        self.config = config
        self.unary: dict[str, Callable[[Sandbox, dict[str, Any], float], Awaitable[dict[str, Any]]]] = {
            "/filesystem.Filesystem/Stat": self.stat,
            "/filesystem.Filesystem/ListDir": self.list_dir,
            "/filesystem.Filesystem/MakeDir": self.make_dir,
            "/filesystem.Filesystem/Move": self.move,
            "/filesystem.Filesystem/Remove": self.remove,
            "/process.Process/List": self.list_processes,
            "/process.Process/SendSignal": self.send_signal,
        }

    async def handle(self, request: web.Request, sandbox: Sandbox) -> web.StreamResponse:
        path = request.path
        if path == "/health" and request.method == "GET":
            return web.Response(status=204)
        if path == "/files" and request.method == "GET":
            return await self.read_file(request, sandbox)
        if path == "/files" and request.method == "POST":
            return await self.write_files(request, sandbox)
        if path == "/process.Process/Start" and request.method == "POST":
            return await self.start(request, sandbox)
        if request.method == "POST" and (path.startswith("/filesystem.Filesystem/")
                                         or path.startswith("/process.Process/")):
            return await self._unary(request, sandbox)
        return web.json_response({"code": 404, "message": f"envd has no {request.method} {path}"}, status=404)

    async def _unary(self, request: web.Request, sandbox: Sandbox) -> web.StreamResponse:
        method = self.unary.get(request.path)
        try:
            if method is None:
                raise ConnectError("unimplemented", f"{request.path.lstrip('/')} is not implemented by verl-sf "
                                                    f"(docs/e2b.md lists what is)")
            body = await connect.unary_message(request)
            answer = await method(sandbox, body, connect.timeout_s(request) or DEFAULT_RPC_TIMEOUT_S)
        except ConnectError as exc:
            return connect.unary_error(exc)
        except GuestError as exc:
            return connect.unary_error(ConnectError(exc.code, str(exc)))
        return web.json_response(answer)

    # ---- Filesystem ------------------------------------------------------------------------------
    async def stat(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        path = _parse(PathRequest, body).path
        return {"entry": _entry_info(await self.sandboxes.call(sandbox, "fs_stat", {"path": path}, timeout))}

    async def list_dir(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = _parse(ListDirRequest, body)
        entries = await self.sandboxes.call(sandbox, "fs_list", {"path": req.path, "depth": req.depth or 1}, timeout)
        return {"entries": [_entry_info(entry) for entry in entries]}

    async def make_dir(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        path = _parse(PathRequest, body).path
        return {"entry": _entry_info(await self.sandboxes.call(sandbox, "fs_make_dir", {"path": path}, timeout))}

    async def move(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = _parse(MoveRequest, body)
        entry = await self.sandboxes.call(sandbox, "fs_move", {"source": req.source,
                                                               "destination": req.destination}, timeout)
        return {"entry": _entry_info(entry)}

    async def remove(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        await self.sandboxes.call(sandbox, "fs_remove", {"path": _parse(PathRequest, body).path}, timeout)
        return {}

    # ---- /files ----------------------------------------------------------------------------------
    async def read_file(self, request: web.Request, sandbox: Sandbox) -> web.StreamResponse:
        path = request.query.get("path")
        if not path:
            return _files_error(400, "query parameter 'path' is required")
        try:
            data = await self.sandboxes.read_file(sandbox, path)
            return await send(request, data, {"Content-Type": "application/octet-stream"})
        except GuestError as exc:
            status = 413 if exc.code == "resource_exhausted" else GUEST_HTTP_STATUS.get(exc.code, 500)
            return _files_error(status, str(exc))
        except DownloadsFull as exc:
            answer = answer_of(exc)
            status, headers = answer.status, answer.headers(request.app["retry_after_s"])
            return web.json_response({"code": status, "message": str(exc)}, status=status, headers=headers)

    async def write_files(self, request: web.Request, sandbox: Sandbox) -> web.Response:
        uploads: list[tuple[str, bytes]] = []
        named: set[str] = set()  # the files named so far
        query_path = request.query.get("path")
        try:
            if request.content_type.startswith("multipart/"):
                reader = await buffered_multipart(request)
                while True:
                    part = await reader.next()
                    if part is None:
                        break
                    if not isinstance(part, BodyPartReader) or part.name != "file":
                        continue
                    target = query_path or part_path(part)
                    if not target:
                        return _files_error(400, "a multipart file part needs a filename (its path) or ?path=")
                    if not is_text(target):
                        return _files_error(400, f"the file part's name {target!r} is not UTF-8 text")
                    if _file_named(target) in named:
                        return _files_error(400, f"you cannot upload multiple files to the same path '{target}' "
                                                 "in one upload request")
                    named.add(_file_named(target))
                    uploads.append((target, await part_bytes(part)))
            else:
                if not query_path:
                    return _files_error(400, "query parameter 'path' is required for an octet-stream upload")
                uploads.append((query_path, await request.read()))  # aiohttp has inflated a gzip body
        except MALFORMED as exc:
            return _files_error(400, f"the upload is malformed: {exc}")
        if not uploads:
            return _files_error(400, "no file in the upload (a multipart part named 'file')")
        written = []
        try:
            for path, data in uploads:
                written.append(await self.sandboxes.call(sandbox, "fs_write", {"path": path},
                                                         data=await base64_text(data)))
        except GuestError as exc:
            return _files_error(GUEST_HTTP_STATUS.get(exc.code, 500), str(exc))
        return web.json_response(written)

    # ---- Process ---------------------------------------------------------------------------------
    async def list_processes(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        running = await self.sandboxes.call(sandbox, "proc_list", {}, timeout)
        return {"processes": [{"pid": p["pid"], "config": {"cmd": p["cmd"], "args": p["args"], "envs": p["envs"],
                                                           "cwd": p["cwd"]}} for p in running]}

    async def send_signal(self, sandbox: Sandbox, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = _parse(SendSignalRequest, body)
        if req.process.pid is None:
            raise ConnectError("unimplemented", "selecting a process by tag is not implemented by verl-sf")
        number = SIGNALS.get(req.signal)
        if number is None:
            raise ConnectError("invalid_argument", f"signal: expected SIGNAL_SIGKILL or SIGNAL_SIGTERM, got "
                                                   f"{req.signal!r}")
        await self.sandboxes.call(sandbox, "proc_signal", {"pid": req.process.pid, "number": number}, timeout)
        return {}

    async def start(self, request: web.Request, sandbox: Sandbox) -> web.StreamResponse:
        """process.Process/Start: a server stream of start, data, keepalive and end events."""
        # The request is read before the answer starts: an HTTP/1.1 client that sees the answer
        # while its body is still on the way stops sending it.
        message: dict[str, Any] | ConnectError
        try:
            message = await connect.stream_message(request)
        except ConnectError as exc:
            message = exc
        response = web.StreamResponse(headers={"Content-Type": connect.STREAM_CONTENT_TYPE})
        await response.prepare(request)
        try:
            if isinstance(message, ConnectError):
                raise message
            await self._run_command(request, message, response, sandbox)
        except ConnectError as exc:
            await response.write(connect.end_frame(exc))
        except GuestError as exc:
            await response.write(connect.end_frame(ConnectError(exc.code, str(exc))))
        except SandboxGone as exc:
            await response.write(connect.end_frame(ConnectError("unavailable", str(exc))))
        else:
            await response.write(connect.end_frame())
        return response

    async def _run_command(self, request: web.Request, message: dict[str, Any], response: web.StreamResponse,
                           sandbox: Sandbox) -> None:
        start = _parse(StartRequest, message)
        if start.pty is not None:
            raise ConnectError("unimplemented", "PTY processes are not implemented by verl-sf")
        if start.stdin:
            raise ConnectError("unimplemented", "stdin for commands is not implemented by verl-sf")
        limit = connect.timeout_s(request)
        deadline = None if limit is None else time.monotonic() + limit
        keepalive_s = _keepalive_interval(request)
        config = start.process
        started = {"cmd": config.cmd, "args": config.args, "envs": config.envs, "cwd": config.cwd,
                   "user": self._user(request)}
        last_write = time.monotonic()
        pid, ended = None, False
        try:
            async for result in self.sandboxes.command(sandbox, started, self.config.command_poll_s, deadline):
                if "pid" in result:
                    pid = int(result["pid"])
                    await response.write(connect.frame({"event": {"start": {"pid": pid}}}))
                    last_write = time.monotonic()
                for stream in ("stdout", "stderr"):
                    if result.get(stream):
                        await response.write(connect.frame({"event": {"data": {stream: result[stream]}}}))
                        last_write = time.monotonic()
                if "end" in result:
                    ended = True
                    end = result["end"]
                    await response.write(connect.frame({"event": {"end": {
                        "exitCode": end["exit_code"], "exited": True, "status": end["status"]}}}))
                    return
                if time.monotonic() - last_write >= keepalive_s:
                    await response.write(connect.frame({"event": {"keepalive": {}}}))
                    last_write = time.monotonic()
        except CommandTimedOut:
            ended = True
            raise ConnectError("deadline_exceeded", f"the command ran past its timeout of {limit:g} s and "
                                                    f"was killed") from None
        finally:
            if not ended and pid is not None and deadline is not None:  # its client left (the SDK, at its timeout)
                self.sandboxes.kill_at(sandbox, pid, deadline)


    def _user(self, request: web.Request) -> str:
        """Who a command runs as: the SDK's `user`, sent as `Authorization: Basic <user:>`; the sandbox's
        user when none is sent."""
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        if not scheme:
            return "user"
        try:
            user = base64.b64decode(encoded, validate=True).decode("ascii").partition(":")[0]
        except (ValueError, UnicodeDecodeError):
            user = ""
        if scheme.lower() != "basic" or user not in USERS:
            raise ConnectError("invalid_argument", f"unknown user {user[:64]!r}: a sandbox has the users 'user' "
                                                   "(the default) and 'root' (sent as `Authorization: Basic "
                                                   "<base64 of 'name:'>`)")
        if user == "root" and not self.sandboxes.executor.offers_root:
            raise ConnectError("permission_denied", f"user 'root' is not offered on the "
                                                    f"{self.sandboxes.executor.isolation} isolation rung: it needs "
                                                    "user namespaces (docs/e2b.md); run the command as 'user'")
        return user


def _keepalive_interval(request: web.Request) -> float:
    raw = request.headers.get("Keepalive-Ping-Interval", "")
    return float(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) < 3600 else 50.0




def _files_error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


def is_text(name: str) -> bool:
    """Whether a name from a request (aiohttp keeps undecodable header bytes as lone surrogates) is
    UTF-8 text, which every JSON answer naming it can carry."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def part_path(part: BodyPartReader) -> Optional[str]:
    """A part's filename with its path, as envd reads it: the SDK's `write_files` names each part by
    its absolute path, which aiohttp's `filename` gives without its leading slashes."""
    stripped = part.filename
    message = email.message.Message()
    message["Content-Disposition"] = part.headers.get(CONTENT_DISPOSITION, "")
    full = message.get_filename()
    return full if isinstance(full, str) and stripped and full.lstrip("\\/") == stripped else stripped


MALFORMED = (ValueError, HttpProcessingError)
"""What reading a multipart body raises for one that is not well formed (a part's header with a NUL, say)."""


async def buffered_multipart(request: web.Request) -> MultipartReader:
    """A reader over the body the server's middleware has already read (the stream is spent)."""
    data = await request.read()
    stream = StreamReader(request.protocol, limit=len(data) + 1, loop=asyncio.get_running_loop())
    stream.feed_data(data)
    stream.feed_eof()
    return MultipartReader(request.headers, stream)


async def part_bytes(part: BodyPartReader) -> bytes:
    """A part's bytes, with a turn of the event loop after each piece: over a buffered body
    `part.read()` searches all of it for the boundary in one turn (~50 ms for 30 MiB, every other
    client waiting).  Pieces grow from aiohttp's 8 KiB to a MiB: each read takes that much of the body
    and puts back what is past the part, so a MiB read per part of an upload of thousands of small
    files copied the body over and over."""
    pieces, size, asked = [], 0, 8 << 10
    while piece := await part.read_chunk(asked):
        pieces.append(piece)
        size += len(piece)
        asked = min(asked * 2, PIECE_CHARS)
        await asyncio.sleep(0)
    return await off_loop(size, b"".join, pieces)
