"""`HttpSandboxBackend`: any Sandbox Fusion compatible server over HTTP (ours or theirs).

verl <= 0.7 posted with `requests` from a pool thread and retried only on 504.  This client
is async (aiohttp, pooled keep-alive connections) and retries what is worth retrying:

* connection failures (refused, reset, dropped before a complete answer, connect time-out)
  and HTTP 429, 502, 503, 504 — with bounded, jittered exponential backoff, waiting at
  least as long as a `Retry-After` header asks;
* never a run that reached the sandbox and failed on its own terms: a 200 whose status is
  Failed or SandboxError is returned as is (re-running it would give the same verdict and
  double the load);
* never a request the server rejected (other 4xx, and 501: `SandboxRequestRejected`, naming
  the status and the server's message), nor a read time-out (the code may still be running).

When no usable answer comes, `SandboxUnavailable` says why, as one of three subclasses that
tell a router (the `cluster` backend) what it may do next: `SandboxUnreachable` (no connection:
the call never reached the server, so another server may run it), `SandboxOverloaded` (429/503:
the server declined it) and `SandboxConnectionLost` (the connection broke after the request was
sent: the run may have started, so it is not re-sent elsewhere).  The object holds its
configuration and the ids of the server sessions it created — the aiohttp session lives in a
per-process, per-event-loop registry — so every copy in a process shares connections.

Sessions (`run_code(request, session=key)`) are verl-sf's `POST /sessions`; a server without
that route (a plain Sandbox Fusion one) raises `SessionsUnsupported`, from `check_sessions()` or
`probe_sessions(url)` before any call, and otherwise on the first call in a session.  A call in a
session is never re-sent after its connection broke (a second run would change the state), nor is
a fork or a snapshot (a second one would be left behind).
"""

from __future__ import annotations

import asyncio
import atexit
import email.utils
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable
from typing import Any, Literal, Optional, TypeVar

import aiohttp
from pydantic import BaseModel, Field, ValidationError, field_validator

from verl_sf.backends.base import BackendConfigBase, SandboxUnavailable, SessionsUnsupported
from verl_sf.backends.sessions import ServerSessionBackend
from verl_sf.errors import ForkUnavailable, InputError, VerlSfError, error_of
from verl_sf.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    SessionCreateRequest,
    SessionForkRequest,
    SessionForkResponse,
    SessionInfo,
    SnapshotInfo,
)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
NO_ROUTE_STATUSES = frozenset({404, 405})  # what a server without POST /sessions answers it
# Asks whether POST /sessions exists without creating one: a server with the route rejects the body (422).
SESSIONS_PROBE_BODY = {"language": None}

ResponseT = TypeVar("ResponseT", bound=BaseModel)
T = TypeVar("T")


def normalize_base_url(url: str) -> str:
    """`http://host:port`, `.../run_code` (verl's `sandbox_fusion_url`) or `.../run_jupyter`
    -> the base URL the endpoints hang off.  Raises ValueError for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"sandbox URL must be a non-empty string, got {url!r}")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"sandbox URL must look like http(s)://host[:port][/run_code], got {url!r}")
    path = parts.path.rstrip("/")
    for endpoint in ("/run_code", "/run_jupyter"):
        if path.endswith(endpoint):
            path = path[: -len(endpoint)]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class HttpBackendConfig(BackendConfigBase):
    """`backend: http`: any Sandbox Fusion compatible server; the yaml's `http:` block sets the retry policy."""

    type: Literal["http"] = "http"
    url: str
    """Base URL; verl's `sandbox_fusion_url` (ending in /run_code) is accepted and trimmed."""
    max_retries: int = Field(5, ge=0)
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    max_retry_after_s: float = Field(60.0, ge=0)
    """A Retry-After longer than this is not waited for: the call fails at once."""
    connect_timeout_s: float = Field(10.0, ge=0)
    server_margin_s: float = Field(60.0, ge=0)
    """Time the server may spend beyond the request's own time-outs (queueing, sandbox start)."""
    connection_limit: int = Field(256, ge=1)

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return normalize_base_url(value)

    def build(self) -> HttpSandboxBackend:
        return HttpSandboxBackend(self)

    def probe_sessions(self) -> bool:
        """Asks the server (POST /sessions, creating nothing): a plain Sandbox Fusion server has no sessions."""
        return probe_sessions(self.url, self.connect_timeout_s)

    @classmethod
    def from_tool_block(cls, block: dict[str, Any], *, sandbox_fusion_url: Optional[str]) -> dict[str, Any]:
        if not sandbox_fusion_url:
            raise ValueError("sandbox_fusion_url is required for the http backend "
                             "(or set backend: local / backend: daytona)")
        return {**super().from_tool_block(block, sandbox_fusion_url=None), "url": sandbox_fusion_url}


class SandboxRequestRejected(InputError):
    """The server refused the request itself (HTTP 4xx other than 429, or 501): retrying cannot help."""

    def __init__(self, url: str, status: int, body: str):
        super().__init__(f"{url} rejected the request with HTTP {status}: {body}")
        self.url = url
        self.status = status
        self.body = body

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:  # crosses Ray and process pools intact
        return type(self), (self.url, self.status, self.body)


class SandboxUnreachable(SandboxUnavailable):
    """No connection could be made (refused, connect time-out): the call never reached the server."""


class SandboxOverloaded(SandboxUnavailable):
    """The server declined the call (HTTP 429/502/503/504) each time it was tried."""


class SandboxConnectionLost(SandboxUnavailable):
    """The connection broke after the request was sent: the run may have started (or finished)."""


# loop -> {session key -> session}.  Weak on the loop: a session is bound to the loop it
# was created on and must never be used from another one.
_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, aiohttp.ClientSession]] = \
    weakref.WeakKeyDictionary()


def _close_sessions_at_exit() -> None:
    """Close sessions nobody closed (verl and pool actors never call close()), so that exiting
    processes do not log aiohttp's "Unclosed client session" / "Unclosed connector" errors."""
    for loop, sessions in list(_SESSIONS.items()):
        for session in list(sessions.values()):
            if session.closed:
                continue
            try:
                if loop.is_running():  # e.g. a Ray actor's loop thread
                    asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=2)
                elif not loop.is_closed():
                    loop.run_until_complete(session.close())
                else:  # `asyncio.run` ended it: the connector needs no loop of its own to be marked closed
                    asyncio.run(session.close())
            except Exception:  # exiting anyway; never turn a clean exit into a traceback
                session.detach()


atexit.register(_close_sessions_at_exit)


def _no_sessions_message(url: str, status: int) -> str:
    return (f"{url} answered POST /sessions with HTTP {status}: this server keeps no sessions (a plain Sandbox "
            f"Fusion server?); serve with `verl-sf serve`, or use the tool without `session: trajectory`")


def sessions_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/sessions"


def probe_sessions(base_url: str, timeout_s: float = 10.0) -> bool:
    """Blocking check, for construction time: True when the server keeps sessions, False when it
    cannot be reached (ask again later); raises `SessionsUnsupported` when it answers without them."""
    url = sessions_url(base_url)
    probe = urllib.request.Request(url, data=json.dumps(SESSIONS_PROBE_BODY).encode(), method="POST",
                                   headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(probe, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError):
        return False
    if status in NO_ROUTE_STATUSES:
        raise SessionsUnsupported(_no_sessions_message(url, status))
    return True


class HttpSandboxBackend(ServerSessionBackend):
    """Sandbox Fusion HTTP API client with pooled connections, bounded retries and verl-sf sessions."""

    name = "http"

    def __init__(self, config: HttpBackendConfig | str, **options: Any):
        """`HttpSandboxBackend(HttpBackendConfig(...))`, or the shorthand `HttpSandboxBackend(url, **options)`."""
        if isinstance(config, HttpBackendConfig):
            if options:
                raise TypeError(f"options {sorted(options)} go into the HttpBackendConfig, not beside it")
            self.config = config
        else:
            self.config = HttpBackendConfig(url=config, **options)
        self.base_url = self.config.url
        super().__init__()

    def __repr__(self) -> str:
        return f"HttpSandboxBackend({self.base_url!r})"

    @property
    def run_code_url(self) -> str:
        return self.base_url + "/run_code"

    @property
    def run_jupyter_url(self) -> str:
        return self.base_url + "/run_jupyter"

    @property
    def sessions_url(self) -> str:
        return sessions_url(self.base_url)

    async def _run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        budget = request.compile_timeout + request.run_timeout + self.config.server_margin_s
        try:
            return await self._post(self.run_code_url, request, RunCodeResponse, budget,
                                    repeatable=request.session_id is None)
        except SandboxRequestRejected as exc:
            gone = _refusal(exc, session_id=request.session_id or "") if exc.status == 404 else None
            if gone is None:
                raise
            raise gone from exc

    async def check_sessions(self) -> None:
        """Raise `SessionsUnsupported` unless the server has POST /sessions (creates nothing)."""
        try:
            await self.request_json("POST", "/sessions", SESSIONS_PROBE_BODY)
        except SandboxRequestRejected as exc:
            if exc.status in NO_ROUTE_STATUSES:
                raise SessionsUnsupported(_no_sessions_message(self.sessions_url, exc.status)) from None

    async def _create_session(self, request: SessionCreateRequest) -> SessionInfo:
        url = self.sessions_url
        try:  # only the fields the caller set: one started from a snapshot may not name a language
            return await self._send("POST", url, request.model_dump(mode="json", exclude_unset=True),
                                    lambda body: _parse(url, body, SessionInfo), self.config.server_margin_s)
        except SandboxRequestRejected as exc:
            refused = _refusal(exc, snapshot_id=request.from_snapshot or "")
            if refused is not None:
                raise refused from exc
            if exc.status in NO_ROUTE_STATUSES:
                raise SessionsUnsupported(_no_sessions_message(self.sessions_url, exc.status)) from None
            raise

    async def _delete_session(self, session_id: str) -> None:
        await self._delete(f"/sessions/{session_id}")

    async def _delete(self, path: str) -> None:
        try:
            await self.request_json("DELETE", path)
        except SandboxRequestRejected as exc:
            if exc.status != 404:  # 404: already gone, which is what was asked
                raise

    async def _fork_session(self, session_id: str, request: SessionForkRequest) -> list[str]:
        forks = await self._on_session(session_id, "fork", request, SessionForkResponse)
        return forks.session_ids

    async def _snapshot_session(self, session_id: str) -> SnapshotInfo:
        return await self._on_session(session_id, "snapshot", None, SnapshotInfo)

    async def _delete_snapshot(self, snapshot_id: str) -> None:
        await self._delete(f"/snapshots/{snapshot_id}")

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        return await self._post(self.run_jupyter_url, request, RunJupyterResponse,
                                request.total_timeout + self.config.server_margin_s)

    async def close(self) -> None:
        """End the server sessions this object created, then close this configuration's connections
        on the running loop (shared by every copy of this backend in the process; the next call
        opens new ones).  Idempotent."""
        await self._end_all_sessions()
        per_loop = _SESSIONS.get(asyncio.get_running_loop(), {})
        session = per_loop.pop(self._session_key(), None)
        if session is not None:
            await session.close()

    # ---- internals ------------------------------------------------------------------------

    async def _on_session(self, session_id: str, action: str, request: Optional[BaseModel],
                          response_type: type[ResponseT]) -> ResponseT:
        """POST /sessions/{id}/{action}, never re-sent after a lost connection (it would leave a second
        copy); the server's refusals as the typed errors every backend raises."""
        url = f"{self.sessions_url}/{session_id}/{action}"
        payload = request.model_dump(mode="json") if request is not None else None
        try:
            return await self._send("POST", url, payload, lambda body: _parse(url, body, response_type),
                                    self.config.server_margin_s, repeatable=False)
        except SandboxRequestRejected as exc:
            if exc.status == 501:
                raise ForkUnavailable(f"{self.base_url}: {_detail(exc.body)}") from exc
            refused = _refusal(exc, session_id=session_id)
            if refused is not None:
                raise refused from exc
            raise

    def _session_key(self) -> tuple:
        return (self.config.connection_limit, self.config.connect_timeout_s)

    def _session(self) -> aiohttp.ClientSession:
        per_loop = _SESSIONS.setdefault(asyncio.get_running_loop(), {})
        session = per_loop.get(self._session_key())
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self.config.connection_limit, limit_per_host=0)
            session = aiohttp.ClientSession(connector=connector)
            per_loop[self._session_key()] = session
        return session

    async def request_json(self, method: str, path: str, payload: Optional[dict[str, Any]] = None,
                           budget_s: Optional[float] = None) -> Any:
        """`method base_url+path` with a JSON body; the decoded JSON answer (same retries as a run)."""
        url = self.base_url + path
        return await self._send(method, url, payload, lambda body: _json(url, body),
                                self.config.server_margin_s if budget_s is None else budget_s)

    async def _post(self, url: str, request: BaseModel, response_type: type[ResponseT], budget_s: float,
                    repeatable: bool = True) -> ResponseT:
        return await self._send("POST", url, request.model_dump(mode="json"),
                                lambda body: _parse(url, body, response_type), budget_s, repeatable)

    async def _send(self, method: str, url: str, payload: Optional[dict[str, Any]], parse: Callable[[bytes], T],
                    budget_s: float, repeatable: bool = True) -> T:
        """`repeatable=False` (a call into a session, whose state a second run would change): a connection
        lost after the request was sent is not retried."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s, sock_read=budget_s)
        attempts = self.config.max_retries + 1
        reason = "no attempt made"
        failure: type[SandboxUnavailable] = SandboxUnavailable
        for attempt in range(attempts):
            retry_after = 0.0
            try:
                async with self._session().request(method, url, json=payload, timeout=timeout) as response:
                    if 200 <= response.status < 300:  # 201 Created, 204 No Content (the session API)
                        return parse(await response.read())
                    body = (await response.text(errors="replace"))[:500]
                    if response.status not in RETRY_STATUSES:
                        typed = _typed(body)  # the server's own error, as the local backend raises it
                        if typed is not None:
                            raise typed
                        if 400 <= response.status < 500 or response.status == 501:  # 501: no such feature here
                            raise SandboxRequestRejected(url, response.status, body)
                        raise SandboxUnavailable(f"{url} answered HTTP {response.status}: {body}")
                    reason, failure = f"HTTP {response.status}", SandboxOverloaded
                    retry_after = _retry_after_s(response.headers.get("Retry-After"))
                    if retry_after > self.config.max_retry_after_s:
                        raise SandboxOverloaded(f"{url} answered {reason} with Retry-After {retry_after:g} s, "
                                                f"more than max_retry_after_s={self.config.max_retry_after_s:g}")
            except aiohttp.SocketTimeoutError as exc:
                raise SandboxUnavailable(f"{url} sent no answer within {budget_s:g} s; not retried because "
                                         f"the run may still be executing") from exc
            except aiohttp.ClientConnectorError as exc:
                reason, failure = f"{type(exc).__name__}: {exc}", SandboxUnreachable
            except aiohttp.ConnectionTimeoutError as exc:
                reason, failure = f"connect time-out: {exc}", SandboxUnreachable
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                reason, failure = f"{type(exc).__name__}: {exc}", SandboxConnectionLost
                if not repeatable:
                    raise SandboxConnectionLost(f"{url}: {reason}; not retried because the call may have run "
                                                f"in its session") from exc
            if attempt + 1 < attempts:
                await asyncio.sleep(max(retry_after, self._backoff_s(attempt)))
        raise failure(f"{url}: no usable answer after {attempts} attempt(s); last: {reason}")

    def _backoff_s(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)] spreads retrying clients out."""
        return random.uniform(0.0, min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** attempt))


def _parse(url: str, body: bytes, response_type: type[ResponseT]) -> ResponseT:
    try:
        return response_type.model_validate(json.loads(body))
    except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        raise SandboxUnavailable(f"{url} answered 200 with a body that is not a "
                                 f"{response_type.__name__}: {str(exc)[:300]}") from exc


def _json(url: str, body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise SandboxUnavailable(f"{url} answered with a body that is not JSON: {str(exc)[:300]}") from exc


def _detail(body: str) -> str:
    """The `detail` of a FastAPI-shaped error body, else the body itself."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        return body
    return detail if isinstance(detail, str) else body


def _body(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _typed(text: str) -> Optional[VerlSfError]:
    """A refusal that names no session rebuilt from the body's `code`, `reason` and `field` (a field
    the server refused: InvalidRequest; a fork the sandbox could not make: ForkFailed)."""
    body = _body(text)
    code, reason, field = (body.get(key) for key in ("code", "reason", "field"))
    if code not in ("invalid", "fork_failed") or not isinstance(reason, str):
        return None
    return error_of(code, reason, field=field if isinstance(field, str) else "")


def _refusal(exc: SandboxRequestRejected, *, session_id: str = "", snapshot_id: str = "") -> Optional[VerlSfError]:
    """The server's refusal as the type it raised there, from its body's `code` and `reason` (a
    server that sends no code: from the status, with its `detail` as the reason)."""
    body = _body(exc.body)
    code, reason = body.get("code"), body.get("reason")
    if not isinstance(code, str):
        by_status = {404: "session_not_found" if session_id else "snapshot_not_found", 409: "session_busy"}
        code = by_status.get(exc.status, "")
    return error_of(code, reason if isinstance(reason, str) else _detail(exc.body), session_id=session_id,
                    snapshot_id=snapshot_id)


def _retry_after_s(value: Optional[str]) -> float:
    """Retry-After is either delta-seconds or an HTTP date; anything unparsable counts as 0."""
    if not value:
        return 0.0
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - time.time())

