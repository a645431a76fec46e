"""E2B's control plane (the API the SDK reaches at E2B_API_URL): create, get, list, kill,
set-timeout and connect.  Errors are E2B's `{"code": status, "message": ...}`.

A sandbox is its creating key's (verl_sf.tenancy): any other key is answered, on every call that
names it, exactly as for an id never given out (404)."""

from __future__ import annotations

import datetime
import time
import urllib.parse
from typing import Any, Optional

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.sandboxes import ENVD_VERSION, GuestError, Sandbox, Sandboxes, SandboxGone, TooManySandboxes
from verl_sf.errors import answer_of
from verl_sf.executor import Overloaded, closed
from verl_sf.json_body import JsonBodyError, request_json
from verl_sf.pages import BadCursor, page
from verl_sf.tenancy import key_accepted, owner_of
from verl_sf.validation import Environment, Metadata, first_error

CLIENT_ID = "verl-sf"
SANDBOX_STATES = ("running", "paused")  # what E2B's list filters on (none is ever paused here)


class NewSandbox(BaseModel):
    """POST /v2/sandboxes (and the older POST /sandboxes) body."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    template_id: StrictStr = Field(alias="templateID")
    timeout: Optional[StrictInt] = Field(default=None, ge=0)  # as E2B's API: `true` and 5.0 are refused
    metadata: Metadata = Field(default_factory=dict)
    env_vars: Environment = Field(default_factory=dict, alias="envVars")
    auto_pause: bool = Field(default=False, alias="autoPause")
    volume_mounts: list[Any] = Field(default_factory=list, alias="volumeMounts")
    mcp: Optional[dict[str, Any]] = None


class TimeoutBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: StrictInt = Field(ge=0)


class RefreshBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    duration: Optional[StrictInt] = Field(default=None, ge=0)


class ListQuery(BaseModel):
    """GET /sandboxes query: a page is `limit` sandboxes after `nextToken` (the X-Next-Token we gave)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    next_token: Optional[str] = Field(default=None, alias="nextToken")
    limit: Optional[int] = Field(default=None, ge=1)


class ConnectBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: Optional[StrictInt] = Field(default=None, ge=0)


def error(status: int, message: str, headers: Optional[dict[str, str]] = None) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status, headers=headers)


def validated(model: type[Any], data: dict[str, Any]) -> Any:
    """`data` as `model`, or the 400 naming the first field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return error(400, first_error(exc))


def _iso(unix: float) -> str:  # one width, so that times sort as they read (server/pages.py)
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat(timespec="microseconds") \
        .replace("+00:00", "Z")


def paged_list(listed: list[dict[str, Any]], token: Optional[str], limit: Optional[int]) -> web.Response:
    """GET /sandboxes's answer: a page of `listed` in start order, and X-Next-Token when more follow."""
    try:
        shown, after = page(listed, lambda s: (s["startedAt"], s["sandboxID"]), token, limit)
    except BadCursor as exc:
        return error(400, f"nextToken: {exc}")
    return web.json_response(shown, headers={"X-Next-Token": after} if after else {})


class ControlPlane:
    def __init__(self, sandboxes: Sandboxes, config: E2BConfig):
        self.sandboxes = sandboxes
        self.config = config

    def add_routes(self, app: web.Application) -> None:
        for prefix in ("", "/v2"):
            app.router.add_post(f"{prefix}/sandboxes", self.create)
            app.router.add_get(f"{prefix}/sandboxes", self.list)
            app.router.add_post(f"{prefix}/sandboxes/{{sandbox_id}}/connect", self.connect)
        app.router.add_get("/sandboxes/metrics", self.unimplemented_for_many)  # not a sandbox named "metrics"
        app.router.add_get("/sandboxes/{sandbox_id}", self.get)
        app.router.add_delete("/sandboxes/{sandbox_id}", self.kill)
        app.router.add_post("/sandboxes/{sandbox_id}/timeout", self.set_timeout)
        app.router.add_post("/sandboxes/{sandbox_id}/refreshes", self.refresh)
        for path in ("/sandboxes/{sandbox_id}/{action}", "/v2/sandboxes/{sandbox_id}/{action}"):
            app.router.add_route("*", path, self.unimplemented)

    def _key(self, request: web.Request) -> str | web.Response:
        """The caller's API key (X-API-Key), or the 401 for a missing or refused one."""
        key = request.headers.get("X-API-Key", "")
        if not key:
            return error(401, "missing API key: set E2B_API_KEY (any non-empty value unless the server requires one)")
        if not key_accepted(self.config.api_key, key):
            return error(401, "invalid API key: printable ASCII, and the server's own if it requires one")
        return key

    async def _body(self, request: web.Request, model: type[Any]) -> Any:
        try:
            body = await request_json(request) if request.body_exists else {}
        except JsonBodyError as exc:
            return error(400, str(exc))
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        return validated(model, body)

    def _check_timeout(self, timeout: int, sandbox: Optional[Sandbox] = None) -> Optional[web.Response]:
        """A sandbox may not outlive the server's session lifetime, counted from its creation."""
        lived = time.time() - sandbox.started_at if sandbox is not None else 0.0
        if lived + timeout > self.sandboxes.max_timeout_s:
            return error(400, f"timeout: {timeout} s would take the sandbox past this server's maximum sandbox "
                              f"lifetime of {self.sandboxes.max_timeout_s:g} s (--session-max-lifetime)")
        return None

    def _sandbox(self, request: web.Request) -> Sandbox | web.Response:
        """The caller's sandbox the path names, or the 401 or 404 (another key's is not found, as a missing one)."""
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        try:
            return self.sandboxes.owned(request.match_info["sandbox_id"], key)
        except SandboxGone as exc:
            return error(404, str(exc))

    async def create(self, request: web.Request) -> web.Response:
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        body = await self._body(request, NewSandbox)
        if isinstance(body, web.Response):
            return body
        if body.auto_pause:
            return error(400, "autoPause: pausing sandboxes is not implemented by verl-sf")
        if body.volume_mounts or body.mcp:
            return error(400, f"{'volumeMounts' if body.volume_mounts else 'mcp'}: not implemented by verl-sf")
        timeout = self.config.default_timeout_s if body.timeout is None else body.timeout
        refused = self._check_timeout(timeout)
        if refused:
            return refused
        try:
            sandbox = await self.sandboxes.create(body.template_id, timeout, body.metadata, body.env_vars,
                                                  owner=owner_of(key))
        except TooManySandboxes as exc:
            return error(429, str(exc))
        except Overloaded as exc:
            answer = answer_of(exc)
            status, headers = answer.status, answer.headers(request.app["retry_after_s"])
            return error(status, f"server overloaded: {exc}", headers)
        except (GuestError, SandboxGone) as exc:
            return error(500, f"the sandbox could not start: {exc}")
        return web.json_response(self._created(sandbox), status=201)

    def _created(self, sandbox: Sandbox) -> dict[str, Any]:
        return {"templateID": sandbox.template_id, "sandboxID": sandbox.id, "clientID": CLIENT_ID,
                "alias": sandbox.template_id, "envdVersion": ENVD_VERSION, "envdAccessToken": sandbox.access_token,
                "trafficAccessToken": sandbox.traffic_token, "domain": None}

    def _listed(self, sandbox: Sandbox) -> dict[str, Any]:
        executor = self.sandboxes.executor.config
        return {"templateID": sandbox.template_id, "sandboxID": sandbox.id, "clientID": CLIENT_ID,
                "alias": sandbox.template_id, "startedAt": _iso(sandbox.started_at), "endAt": _iso(sandbox.end_at),
                "cpuCount": 1, "memoryMB": executor.default_memory_mb, "diskSizeMB": executor.workdir_size_mb,
                "metadata": sandbox.metadata, "state": "running", "envdVersion": ENVD_VERSION}

    async def get(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        return web.json_response({**self._listed(sandbox), "envdAccessToken": sandbox.access_token, "domain": None})

    async def list(self, request: web.Request) -> web.Response:
        key = self._key(request)
        if isinstance(key, web.Response):
            return key
        query = validated(ListQuery, dict(request.query))
        if isinstance(query, web.Response):
            return query
        states = request.query.get("state")
        unknown = [state for state in states.split(",") if state not in SANDBOX_STATES] if states is not None else []
        if unknown:
            return error(400, f"state: {unknown[0]!r} is not one of {', '.join(SANDBOX_STATES)}")
        try:  # as the SDK sends it: key=value pairs, URL-encoded and joined by &
            wanted = dict(urllib.parse.parse_qsl(request.query.get("metadata", ""), strict_parsing=True))
        except ValueError:
            return error(400, "metadata: not key=value pairs joined by '&' (each URL-encoded)")
        sandboxes = list(self.sandboxes.listing(key))
        if states is not None and "running" not in states.split(","):
            sandboxes = []
        listed = [self._listed(s) for s in sandboxes if all(s.metadata.get(k) == v for k, v in wanted.items())]
        return paged_list(listed, query.next_token, query.limit)

    async def kill(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        await closed(self.sandboxes.kill(sandbox.id))
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        body = await self._body(request, TimeoutBody)
        if isinstance(body, web.Response):
            return body
        refused = self._check_timeout(body.timeout, sandbox)
        if refused:
            return refused
        self.sandboxes.set_timeout(sandbox, body.timeout)
        return web.Response(status=204)

    async def refresh(self, request: web.Request) -> web.Response:
        """The older SDKs' keep-alive: `{"duration": s}` extends the sandbox's life to now + s."""
        sandbox = self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        body = await self._body(request, RefreshBody)
        if isinstance(body, web.Response):
            return body
        duration = self.config.default_timeout_s if body.duration is None else body.duration
        refused = self._check_timeout(duration, sandbox)
        if refused:
            return refused
        self.sandboxes.extend(sandbox, duration)
        return web.Response(status=204)

    async def connect(self, request: web.Request) -> web.Response:
        """Connect to a running sandbox: its access details; a longer timeout extends its life."""
        sandbox = self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        body = await self._body(request, ConnectBody)
        if isinstance(body, web.Response):
            return body
        if body.timeout is not None:
            refused = self._check_timeout(body.timeout, sandbox)
            if refused:
                return refused
            self.sandboxes.extend(sandbox, body.timeout)
        return web.json_response(self._created(sandbox), status=200)

    async def unimplemented(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)  # another key's sandbox is not found here either
        if isinstance(sandbox, web.Response):
            return sandbox
        return _unimplemented(request)

    async def unimplemented_for_many(self, request: web.Request) -> web.Response:
        key = self._key(request)
        return key if isinstance(key, web.Response) else _unimplemented(request)


def _unimplemented(request: web.Request) -> web.Response:
    return error(501, f"{request.method} {request.path} is not implemented by verl-sf (docs/e2b.md lists what is)")
