"""E2B sandboxes on the executor's sessions: one live python session per sandbox.

A sandbox is created as a session, whose interpreter holds the guest agent (zygote/guest.py) from
its warm-up; every E2B call is one session call into it.  The executor runs one call at a time per session; the
sandbox's lock makes that order explicit (code contexts, commands and file calls of one sandbox
take turns).  Sandboxes end at their timeout (reaped here), on kill, or when the server stops.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Optional, TypeVar, Union

from verl_sf.e2b import answers
from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.ready import Ready, ReadyBoxes
from verl_sf.errors import CapacityError, NotFoundError, SessionGone, VerlSfError
from verl_sf.executor import Closed, Closing, Executor, closed_now
from verl_sf.executor.live_table import LiveTable
from verl_sf.executor.zygote.wire import loads
from verl_sf.models import (
    MAX_TIMEOUT_S,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreateRequest,
)
from verl_sf.off_loop import PIECE_CHARS, base64_of, bytes_of, encoded, off_loop, text_size
from verl_sf.tenancy import Owner, new_token, owns

Response = TypeVar("Response", bound=Union[RunCodeResponse, RunJupyterResponse])

log = logging.getLogger(__name__)
GUEST = "__import__('zygote.guest', fromlist=['guest'])"  # the agent in a session (executor/zygote/guest.py)
MARK = "\x1e\x1fverl-sf-e2b:"  # guest.MARK
ENDED_KEPT = 10_000  # ended sandboxes whose reason a late call is still told
WARMUP_CELL = "_warm = [i for i in range(3)]\nprint(end='')\ndel _warm\n[0]"  # shaped like most cells
ENVD_VERSION = "0.5.7"
"""The envd version we answer as: octet-stream uploads on; features of later versions (file
metadata, watchers) are refused by the SDK itself with a clear message."""


class SandboxGone(NotFoundError):
    """No live sandbox by that id (never created, killed, timed out, or its session ended)."""

    def __init__(self, sandbox_id: str, reason: str):
        super().__init__(f"The sandbox {sandbox_id} was not found: {reason}")
        self.sandbox_id = sandbox_id
        self.reason = reason


class TooManySandboxes(CapacityError):
    """The server's cap on live sandboxes is reached."""


class CommandTimedOut(VerlSfError):
    """A command ran past its deadline and was killed."""


class GuestError(VerlSfError):
    """A call the sandbox refused or failed; `code` is a Connect error code (not_found, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class Context:
    id: str
    language: str
    cwd: str


@dataclasses.dataclass
class Sandbox:
    id: str
    session_id: str
    access_token: str
    """envd's token (X-Access-Token)."""
    traffic_token: str
    """The other ports' token (E2B-Traffic-Access-Token: the code interpreter's calls carry it)."""
    owner: Optional[Owner]
    """The API key that created it (verl_sf.tenancy); None: no key's (a sandbox a server part made)."""
    template_id: str
    metadata: dict[str, str]
    started_at: float
    end_at: float
    """Unix times."""
    default_context: str
    contexts: dict[str, Context] = dataclasses.field(default_factory=dict)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


def call_code(function: str, payload: dict[str, Any], data: Optional[str] = None) -> str:
    """Python that calls the guest's `function` with one JSON string: data travels as a literal.
    `data` (base64, whose letters need no escaping in JSON or a Python literal) is put in as it is,
    never encoded again: for a 60 MB upload that was ~1 s of the event loop's time.  A large payload
    (an execution's code) is encoded and quoted a piece at a time: call it in a thread (`off_loop`)."""
    spliced = "" if data is None else f", '{data}'"
    return f"{GUEST}.{function}('{_quoted(encoded(payload).decode())}'{spliced})"


def _quoted(text: str) -> str:
    """JSON's text (printable ASCII) as the inside of a single-quoted Python literal, a piece at a time."""
    return "".join(text[at:at + PIECE_CHARS].replace("\\", "\\\\").replace("'", "\\'")
                   for at in range(0, len(text), PIECE_CHARS))


async def base64_text(data: bytes) -> str:
    """`data` in base64, in a thread when large, a piece at a time (one call on tens of MB would hold
    the event loop, and every other client, for the whole encoding)."""
    return await off_loop(len(data), base64_of, data)


def parse_answer(stdout: str) -> Any:
    """The guest's answer line; GuestError when it is missing or says the call failed."""
    _, found, tail = stdout.rpartition(MARK)
    if not found:
        raise GuestError("internal", "the sandbox gave no answer to the call")
    try:
        answer = loads(tail.split("\n", 1)[0])  # the sandbox's code could have printed it: depth bounded
    except ValueError as exc:
        raise GuestError("internal", f"the sandbox's answer is not JSON: {exc}") from None
    if not isinstance(answer, dict):
        raise GuestError("internal", "the sandbox's answer is not an object")
    if "error" in answer:
        error = answer["error"] if isinstance(answer["error"], dict) else {}
        raise GuestError(str(error.get("code", "internal")), str(error.get("message", "the call failed")))
    return answer.get("ok")


def checked(response: RunCodeResponse) -> tuple[str, dict[str, str]]:
    """A guest call's stdout and fetched files; GuestError when it did not finish or gave no answer."""
    result = response.run_result
    if result is None or result.status.value != "Finished":
        raise GuestError("deadline_exceeded" if result is not None and result.status.value == "TimeLimitExceeded"
                         else "internal", response.message or "the call did not finish")
    if MARK not in (result.stdout or ""):
        stderr = (result.stderr or "").strip()[-2000:]
        raise GuestError("internal", f"the sandbox gave no answer to the call: {stderr or response.message}")
    return result.stdout or "", response.files


@dataclasses.dataclass(frozen=True)
class Ended:
    """What is kept of an ended sandbox: why it ended, told only to its owner and to its tokens."""

    reason: str
    owner: Optional[Owner]
    access_token: str
    traffic_token: str


class Sandboxes:
    def __init__(self, executor: Executor, config: E2BConfig):
        self.executor = executor
        self.config = config
        self.table: LiveTable[str, Sandbox, Ended] = LiveTable(lambda sandbox: sandbox.id, ENDED_KEPT)
        """The live sandboxes by id, and what is kept of ended ones."""
        self._opening: collections.Counter[Optional[Owner]] = collections.Counter()
        """Sandboxes starting (their session on the way), by owner."""
        self._reaper: Optional[asyncio.Task[None]] = None
        self.ready = ReadyBoxes(executor, config, self._start_ready)
        self._timers: set[asyncio.Task[None]] = set()
        """Commands to kill at their timeout, whose client left first."""

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for timer in self._timers:
            timer.cancel()
        self.ready.close()
        for sandbox in list(self.table.live.values()):
            self.kill(sandbox.id, "the server stopped")

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            self.reap(time.time())

    def reap(self, now: float) -> None:
        """Kill the sandboxes past their timeout, and end the ready ones unused too long (Unix time `now`)."""
        self.ready.expire(now)
        for sandbox, reason in self.table.due(lambda s: "it reached its timeout" if s.end_at <= now else None):
            self.kill(sandbox.id, reason)

    @property
    def max_timeout_s(self) -> float:
        return min(MAX_TIMEOUT_S, self.executor.config.session_max_lifetime_s)

    # ---- control plane -----------------------------------------------------------------------
    async def create(self, template_id: str, timeout_s: int, metadata: dict[str, str],
                     envs: dict[str, str], owner: Optional[Owner] = None,
                     home_alias: Optional[str] = "/home/user") -> Sandbox:
        """A new sandbox of `owner` (verl_sf.tenancy; None: of no API key, so no key lists or reaches it);
        `home_alias` is the home its files calls show for the session's (None: the real path)."""
        self._prune()
        if len(self.table) + sum(self._opening.values()) >= self.config.max_sandboxes:
            raise TooManySandboxes(f"{self.config.max_sandboxes} sandboxes are running or starting, the server's cap "
                                   f"(max_sandboxes); kill some or wait for their timeout")
        per_key = self.config.max_sandboxes_per_key
        if owner is not None and per_key is not None and \
                sum(s.owner == owner for s in self.table.live.values()) + self._opening[owner] >= per_key:
            raise TooManySandboxes(f"this key has {per_key} sandboxes running or starting, the server's cap per key "
                                   f"(max_sandboxes_per_key); kill some or wait for their timeout")
        self._opening[owner] += 1  # a place is taken from the first await on: a burst cannot pass the caps
        try:
            ready = self.ready.take(home_alias, timeout_s)
            if ready is None:
                session_id, default_context = await self._new_session(), secrets.token_hex(16)
            else:
                session_id, default_context = ready.session_id, ready.default_context
        finally:
            self._opening[owner] -= 1
            if not self._opening[owner]:
                del self._opening[owner]  # no entry kept per key ever seen
        now = time.time()
        sandbox = Sandbox(id=f"{self.config.id_prefix}i{secrets.token_hex(10)}", session_id=session_id,
                          access_token=new_token(), traffic_token=new_token(), owner=owner, template_id=template_id,
                          metadata=metadata,
                          started_at=now, end_at=now + timeout_s, default_context=default_context)
        sandbox.contexts[sandbox.default_context] = Context(sandbox.default_context, "python", "/home/user")
        self.table.add(sandbox)
        try:
            if ready is None or envs:  # a ready sandbox is set up already, with no environment variables
                await self.call_python(sandbox, self._setup_code(default_context, envs, home_alias), 30.0)
        except BaseException:
            self.kill(sandbox.id, "it could not start")
            raise
        return sandbox

    async def _new_session(self) -> str:
        info = await self.executor.create_session(SessionCreateRequest(language="python", idle_ttl_s=MAX_TIMEOUT_S),
                                                   cells=True, rooted=True)
        return info.session_id

    @staticmethod
    def _setup_code(default_context: str, envs: dict[str, str], home_alias: Optional[str]) -> str:
        return call_code("setup", {"envs": envs, "default_context": default_context, "home_alias": home_alias})

    async def _start_ready(self, home_alias: Optional[str]) -> Ready:
        """A sandbox's session set up and its first cell run in a context dropped after: one cell of one
        session call, as every cell of a refill takes CPU from the sandboxes in use."""
        ready = Ready(await self._new_session(), secrets.token_hex(16), time.time())
        try:
            cell = call_code("warm", {"envs": {}, "default_context": ready.default_context, "home_alias": home_alias,
                                      "code": WARMUP_CELL})
            warmed = await self.executor.run_jupyter(RunJupyterRequest(cells=[cell], total_timeout=30.0,
                                                                       session_id=ready.session_id))
            if warmed.status.value != "Success" or not warmed.session_alive or len(warmed.cells) != 1 \
                    or warmed.cells[0].error:
                raise GuestError("internal", f"the warm-up cell failed: {warmed.message or warmed.cells}")
            parse_answer(warmed.cells[0].stdout)
        except BaseException:
            self.executor.end_session(ready.session_id)
            raise
        return ready

    def record(self, sandbox_id: str) -> Union[Sandbox, Ended, None]:
        """The live sandbox by that id, what is kept of an ended one, or None; the same lookups whichever."""
        sandbox = self.table.live.get(sandbox_id)
        if sandbox is not None and sandbox.session_id not in self.executor.sessions:
            self._forget(sandbox, self._session_ended(sandbox))
        return self.table.live.get(sandbox_id) or self.table.ended(sandbox_id)

    def get(self, sandbox_id: str) -> Sandbox:
        record = self.record(sandbox_id)
        if isinstance(record, Sandbox):
            return record
        raise SandboxGone(sandbox_id, record.reason if record is not None else "no such sandbox")

    def owned(self, sandbox_id: str, api_key: str) -> Sandbox:
        """`api_key`'s live sandbox by that id; else SandboxGone, whose reason only the owner is told."""
        record = self.record(sandbox_id)
        if not owns(record.owner if record is not None else None, api_key):
            raise SandboxGone(sandbox_id, "no such sandbox")
        return self.get(sandbox_id)

    def end_reason(self, sandbox_id: str) -> Optional[str]:
        ended = self.table.ended(sandbox_id)
        return ended.reason if ended is not None else None

    def listing(self, api_key: str) -> list[Sandbox]:
        """`api_key`'s live sandboxes."""
        self._prune()
        return [sandbox for sandbox in self.table.live.values() if owns(sandbox.owner, api_key)]

    def kill(self, sandbox_id: str, reason: str = "it was killed") -> Closing[Closed]:
        """End a sandbox now; the future is done once every process of it is killed (`closed` waits)."""
        sandbox = self.get(sandbox_id)
        self._forget(sandbox, reason)
        try:
            return self.executor.end_session(sandbox.session_id, f"its sandbox ended: {reason}")
        except SessionGone:  # its session ended already
            return closed_now()

    def set_timeout(self, sandbox: Sandbox, timeout_s: float) -> None:
        sandbox.end_at = time.time() + timeout_s

    def extend(self, sandbox: Sandbox, timeout_s: float) -> None:
        """Connect and refresh: the sandbox lives at least `timeout_s` more, never less than it had."""
        sandbox.end_at = max(sandbox.end_at, time.time() + timeout_s)

    def _forget(self, sandbox: Sandbox, reason: str) -> None:
        self.table.forget(sandbox, Ended(reason, sandbox.owner, sandbox.access_token, sandbox.traffic_token))

    def _session_ended(self, sandbox: Sandbox) -> str:
        reason = self.executor.session_end_reason(sandbox.session_id)
        return f"its session ended ({reason})" if reason else "its session ended"

    def _prune(self) -> None:
        sessions = self.executor.sessions
        for sandbox, reason in self.table.due(lambda s: None if s.session_id in sessions else self._session_ended(s)):
            self._forget(sandbox, reason)

    # ---- calls into the sandbox ----------------------------------------------------------------
    async def call(self, sandbox: Sandbox, operation: str, args: dict[str, Any], timeout_s: float = 60.0,
                   data: Optional[str] = None) -> Any:
        """One guest operation; its result, or GuestError.  `data`: the operation's base64 `data` argument."""
        size = len(data or "") + text_size(args)  # a command's arguments, a file's data
        code = await off_loop(size, call_code, "dispatch", {"op": operation, "args": args}, data)
        stdout, _ = await self.call_python(sandbox, code, timeout_s)
        answer = parse_answer(stdout)
        wrong = answers.checked(operation, answer)
        if wrong is not None:
            raise GuestError("internal", f"the sandbox's answer to {operation} is malformed ({wrong}): "
                                         "its own code may have printed it")
        return answer

    async def command(self, sandbox: Sandbox, start: dict[str, Any], poll_s: float,
                      deadline: Optional[float]) -> AsyncIterator[dict[str, Any]]:
        """A command's life: the answer of its start (with `pid`), then of each poll (new output, base64
        per stream, and at last `end`); killed at `deadline` (monotonic), raising CommandTimedOut.
        Each poll holds the sandbox at most `poll_s`, so its other calls run in between."""
        result = await self.call(sandbox, "proc_start", {**start, "wait": poll_s})
        pid = int(result["pid"])
        while True:
            yield result
            if "end" in result:
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                await self.call(sandbox, "proc_signal", {"pid": pid, "number": 9})
                raise CommandTimedOut(f"the command ran past its timeout and was killed (pid {pid})")
            wait = poll_s if deadline is None else max(0.0, min(poll_s, deadline - now))
            result = await self.call(sandbox, "proc_poll", {"pid": pid, "wait": wait})

    def kill_at(self, sandbox: Sandbox, pid: int, deadline: float) -> None:
        """Kill a command at its `deadline` (monotonic) though no client follows it any more: envd's
        `timeout` ends the command, and the SDK closes its stream at that very time."""
        timer = asyncio.create_task(self._kill_at(sandbox, pid, deadline))
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    async def _kill_at(self, sandbox: Sandbox, pid: int, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(GuestError, SandboxGone):  # it ended, or its sandbox did
            await self.call(sandbox, "proc_signal", {"pid": pid, "number": 9})

    async def read_file(self, sandbox: Sandbox, path: str) -> bytes:
        """A file's bytes: inline when small, else through the session's file fetch (its own size cap);
        GuestError when it cannot be read (`resource_exhausted` when it is too large to fetch)."""
        inline_limit = self.executor.config.output_limit_bytes // 2
        result = await self.call(sandbox, "fs_read", {"path": path, "inline_limit": inline_limit})
        try:
            if "data" in result:
                return base64.b64decode(result["data"])
            code = call_code("dispatch", {"op": "fs_stat", "args": {"path": result["fetch"]}})
            stdout, files = await self.call_python(sandbox, code, 60.0, [result["fetch"]])
            parse_answer(stdout)
            if result["fetch"] not in files:
                limit = self.executor.config.fetch_file_limit_bytes
                if int(result.get("size", 0)) > limit:
                    raise GuestError("resource_exhausted", f"file '{path}' is {result['size']} bytes: a read "
                                     f"returns at most {limit} bytes (the server's fetch limit)")
                raise GuestError("resource_exhausted", f"file '{path}' is larger than {inline_limit} bytes, and "
                                 "a file that large is read only below the home, /tmp or /mnt/data")
            return await off_loop(len(files[result["fetch"]]), bytes_of, files[result["fetch"]])
        except (binascii.Error, TypeError, ValueError, KeyError) as exc:
            raise GuestError("internal", f"the sandbox's answer is malformed: {exc}") from None

    async def call_python(self, sandbox: Sandbox, code: str, timeout_s: float,
                          fetch: Optional[list[str]] = None) -> tuple[str, dict[str, str]]:
        response = await self._in_session(sandbox, self.executor.run_code(self._python(sandbox.session_id, code,
                                                                                        timeout_s, fetch)))
        if response.session_alive is False:
            raise SandboxGone(sandbox.id, response.message)
        return checked(response)

    @staticmethod
    def _python(session_id: str, code: str, timeout_s: float, fetch: Optional[list[str]] = None) -> RunCodeRequest:
        return RunCodeRequest(code=code, language="python", session_id=session_id,
                              run_timeout=min(max(timeout_s, 0.001), MAX_TIMEOUT_S), fetch_files=fetch or [])

    async def run_cells(self, sandbox: Sandbox, cells: list[str], timeout_s: float) -> RunJupyterResponse:
        request = RunJupyterRequest(cells=cells, total_timeout=min(timeout_s, MAX_TIMEOUT_S),
                                    session_id=sandbox.session_id)
        return await self._in_session(sandbox, self.executor.run_jupyter(request))

    async def _in_session(self, sandbox: Sandbox, call: Awaitable[Response]) -> Response:
        """One call into the sandbox's session, one at a time; a session that is gone ends the sandbox."""
        async with sandbox.lock:
            try:
                response = await call
            except SessionGone as exc:
                self._forget(sandbox, exc.reason)
                raise SandboxGone(sandbox.id, exc.reason) from None
        if response.session_alive is False:
            self._forget(sandbox, response.message)
        return response
