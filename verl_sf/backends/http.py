"""`HttpSandboxBackend`: any Sandbox Fusion compatible server over HTTP (ours or theirs).

verl <= 0.7 posted with `requests` from a pool thread and retried only on 504.  This client
is async (aiohttp, pooled keep-alive connections) and retries what is worth retrying:

* connection failures (refused, reset, dropped before a complete answer, connect time-out)
  and HTTP 429, 502, 503, 504 — with bounded, jittered exponential backoff, waiting at
  least as long as a `Retry-After` header asks;
* never a run that reached the sandbox and failed on its own terms: a 200 whose status is
  Failed or SandboxError is returned as is (re-running it would give the same verdict and
  double the load);
* never a request the server rejected (other 4xx: `SandboxRequestRejected`, naming the
  status and the server's message), nor a read time-out (the code may still be running).

When no usable answer comes, `SandboxUnavailable` says why, as one of three subclasses that
tell a router (the `cluster` backend) what it may do next: `SandboxUnreachable` (no connection:
the call never reached the server, so another server may run it), `SandboxOverloaded` (429/503:
the server declined it) and `SandboxConnectionLost` (the connection broke after the request was
sent: the run may have started, so it is not re-sent elsewhere).  The object holds only its
configuration — the aiohttp session lives in a per-process, per-event-loop registry — so
it pickles cheaply into Ray pool actors and every copy in a process shares connections.
"""

from __future__ import annotations

import asyncio
import atexit
import email.utils
import json
import random
import time
import weakref
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from verl_sf.backends.base import SandboxBackend, SandboxUnavailable
from verl_sf.backends.config import HttpBackendConfig
from verl_sf.errors import VerlSfError
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse

RETRY_STATUSES = frozenset({429, 502, 503, 504})

ResponseT = TypeVar("ResponseT", bound=BaseModel)
T = TypeVar("T")


class SandboxRequestRejected(VerlSfError, ValueError):
    """The server refused the request itself (HTTP 4xx other than 429): retrying cannot help."""

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
    """Close sessions nobody closed (pool actors never call close()), so that exiting
    processes do not log aiohttp's "Unclosed client session" warnings."""
    for loop, sessions in list(_SESSIONS.items()):
        for session in list(sessions.values()):
            if session.closed:
                continue
            try:
                if loop.is_running():  # e.g. a Ray actor's loop thread
                    asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=2)
                elif not loop.is_closed():
                    loop.run_until_complete(session.close())
                else:
                    session.detach()
            except Exception:  # exiting anyway; never turn a clean exit into a traceback
                session.detach()


atexit.register(_close_sessions_at_exit)


class HttpSandboxBackend(SandboxBackend):
    """Sandbox Fusion HTTP API client with pooled connections and bounded retries."""

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

    def __repr__(self) -> str:
        return f"HttpSandboxBackend({self.base_url!r})"

    @property
    def run_code_url(self) -> str:
        return self.base_url + "/run_code"

    @property
    def run_jupyter_url(self) -> str:
        return self.base_url + "/run_jupyter"

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        budget = request.compile_timeout + request.run_timeout + self.config.server_margin_s
        return await self._post(self.run_code_url, request, RunCodeResponse, budget)

    async def run_jupyter(self, request: RunJupyterRequest) -> RunJupyterResponse:
        return await self._post(self.run_jupyter_url, request, RunJupyterResponse,
                                request.total_timeout + self.config.server_margin_s)

    async def close(self) -> None:
        """Close this configuration's session on the running loop (shared by every copy of
        this backend in the process; the next call opens a new one).  Idempotent."""
        per_loop = _SESSIONS.get(asyncio.get_running_loop(), {})
        session = per_loop.pop(self._session_key(), None)
        if session is not None:
            await session.close()

    # ---- internals ------------------------------------------------------------------------

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

    async def _post(self, url: str, request: BaseModel, response_type: type[ResponseT], budget_s: float) -> ResponseT:
        return await self._send("POST", url, request.model_dump(mode="json"),
                                lambda body: _parse(url, body, response_type), budget_s)

    async def _send(self, method: str, url: str, payload: Optional[dict[str, Any]], parse: Callable[[bytes], T],
                    budget_s: float) -> T:
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
                        if 400 <= response.status < 500:
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

