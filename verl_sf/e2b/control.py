"""E2B's control plane (the API the SDK reaches at E2B_API_URL): create, get, list, kill,
set-timeout and connect.  Errors are E2B's `{"code": status, "message": ...}`."""

from __future__ import annotations

import datetime
import hmac
import time
import urllib.parse
from typing import Any, Optional

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.sandboxes import ENVD_VERSION, GuestError, Sandbox, Sandboxes, SandboxGone, TooManySandboxes
from verl_sf.executor import Overloaded
from verl_sf.validation import first_error

CLIENT_ID = "verl-sf"


class NewSandbox(BaseModel):
    """POST /v2/sandboxes (and the older POST /sandboxes) body."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    template_id: StrictStr = Field(alias="templateID")
    timeout: Optional[int] = Field(default=None, ge=0)
    metadata: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    env_vars: dict[StrictStr, StrictStr] = Field(default_factory=dict, alias="envVars")
    auto_pause: bool = Field(default=False, alias="autoPause")
    volume_mounts: list[Any] = Field(default_factory=list, alias="volumeMounts")
    mcp: Optional[dict[str, Any]] = None


class TimeoutBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: int = Field(ge=0)


class ConnectBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: Optional[int] = Field(default=None, ge=0)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


def _iso(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class ControlPlane:
    def __init__(self, sandboxes: Sandboxes, config: E2BConfig):
        self.sandboxes = sandboxes
        self.config = config

    def add_routes(self, app: web.Application) -> None:
        for prefix in ("", "/v2"):
            app.router.add_post(f"{prefix}/sandboxes", self.create)
            app.router.add_get(f"{prefix}/sandboxes", self.list)
            app.router.add_post(f"{prefix}/sandboxes/{{sandbox_id}}/connect", self.connect)
        app.router.add_get("/sandboxes/{sandbox_id}", self.get)
        app.router.add_delete("/sandboxes/{sandbox_id}", self.kill)
        app.router.add_post("/sandboxes/{sandbox_id}/timeout", self.set_timeout)
        app.router.add_post("/sandboxes/{sandbox_id}/refreshes", self.refresh)
        for path in ("/sandboxes/{sandbox_id}/{action}", "/v2/sandboxes/{sandbox_id}/{action}"):
            app.router.add_route("*", path, self.unimplemented)

    def _authorized(self, request: web.Request) -> Optional[web.Response]:
        key = request.headers.get("X-API-Key", "")
        if not key:
            return error(401, "missing API key: set E2B_API_KEY (any non-empty value unless the server requires one)")
        if self.config.api_key is not None and not hmac.compare_digest(key.encode(), self.config.api_key.encode()):
            return error(401, "invalid API key")
        return None

    async def _body(self, request: web.Request, model: type[Any]) -> Any:
        try:
            body = await request.json() if request.body_exists else {}
        except ValueError as exc:
            return error(400, f"the body is not JSON: {exc}")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            return error(400, first_error(exc))

    def _check_timeout(self, timeout: int, sandbox: Optional[Sandbox] = None) -> Optional[web.Response]:
        """A sandbox may not outlive the server's session lifetime, counted from its creation."""
        lived = time.time() - sandbox.started_at if sandbox is not None else 0.0
        if lived + timeout > self.sandboxes.max_timeout_s:
            return error(400, f"timeout: {timeout} s would take the sandbox past this server's maximum sandbox "
                              f"lifetime of {self.sandboxes.max_timeout_s:g} s (--session-max-lifetime)")
        return None

    def _sandbox(self, request: web.Request) -> Sandbox | web.Response:
        try:
            return self.sandboxes.get(request.match_info["sandbox_id"])
        except SandboxGone as exc:
            return error(404, str(exc))

    async def create(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
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
            sandbox = await self.sandboxes.create(body.template_id, timeout, body.metadata, body.env_vars)
        except TooManySandboxes as exc:
            return error(429, str(exc))
        except Overloaded as exc:
            return error(503, f"server overloaded: {exc}")
        except (GuestError, SandboxGone) as exc:
            return error(500, f"the sandbox could not start: {exc}")
        return web.json_response(self._created(sandbox), status=201)

    def _created(self, sandbox: Sandbox) -> dict[str, Any]:
        return {"templateID": sandbox.template_id, "sandboxID": sandbox.id, "clientID": CLIENT_ID,
                "alias": sandbox.template_id, "envdVersion": ENVD_VERSION, "envdAccessToken": sandbox.access_token,
                "trafficAccessToken": None, "domain": None}

    def _listed(self, sandbox: Sandbox) -> dict[str, Any]:
        executor = self.sandboxes.executor.config
        return {"templateID": sandbox.template_id, "sandboxID": sandbox.id, "clientID": CLIENT_ID,
                "alias": sandbox.template_id, "startedAt": _iso(sandbox.started_at), "endAt": _iso(sandbox.end_at),
                "cpuCount": 1, "memoryMB": executor.default_memory_mb, "diskSizeMB": executor.workdir_size_mb,
                "metadata": sandbox.metadata, "state": "running", "envdVersion": ENVD_VERSION}

    async def get(self, request: web.Request) -> web.Response:
        sandbox = self._authorized(request) or self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        return web.json_response({**self._listed(sandbox), "envdAccessToken": sandbox.access_token, "domain": None})

    async def list(self, request: web.Request) -> web.Response:
        refused = self._authorized(request)
        if refused:
            return refused
        states = request.query.get("state")
        wanted = dict(urllib.parse.parse_qsl(request.query.get("metadata", "")))
        sandboxes = sorted(self.sandboxes.listing(), key=lambda s: s.started_at)
        if states is not None and "running" not in states.split(","):
            sandboxes = []
        sandboxes = [s for s in sandboxes if all(s.metadata.get(k) == v for k, v in wanted.items())]
        start = int(request.query.get("nextToken", "0")) if request.query.get("nextToken", "0").isdigit() else 0
        limit = request.query.get("limit", "")
        count = int(limit) if limit.isdigit() and int(limit) > 0 else len(sandboxes)
        page = sandboxes[start:start + count]
        headers = {"X-Next-Token": str(start + count)} if start + count < len(sandboxes) else {}
        return web.json_response([self._listed(s) for s in page], headers=headers)

    async def kill(self, request: web.Request) -> web.Response:
        sandbox = self._authorized(request) or self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        self.sandboxes.kill(sandbox.id)
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.Response:
        sandbox = self._authorized(request) or self._sandbox(request)
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
        sandbox = self._authorized(request) or self._sandbox(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        try:
            body = await request.json() if request.body_exists else {}
            duration = int(body.get("duration", self.config.default_timeout_s))
        except (ValueError, TypeError, AttributeError):
            return error(400, "duration: must be an integer number of seconds")
        refused = self._check_timeout(duration, sandbox)
        if refused:
            return refused
        self.sandboxes.extend(sandbox, duration)
        return web.Response(status=204)

    async def connect(self, request: web.Request) -> web.Response:
        """Connect to a running sandbox: its access details; a longer timeout extends its life."""
        sandbox = self._authorized(request) or self._sandbox(request)
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
        refused = self._authorized(request)
        return refused or error(501, f"{request.method} {request.path} is not implemented by verl-sf "
                                     f"(docs/e2b.md lists what is)")
