"""Daytona's control plane under /api (what the SDK reaches at DAYTONA_API_URL): create, get, list,
delete, start, stop, labels, auto-stop and auto-delete intervals, the toolbox's URL."""

from __future__ import annotations

import shlex
from typing import Any, Optional

from aiohttp import web

from verl_sf.daytona.config import DaytonaConfig
from verl_sf.daytona.sandboxes import (
    LANGUAGE_LABEL,
    DaytonaSandbox,
    DaytonaSandboxes,
    NameTaken,
    NotFound,
    Spec,
    TooManySandboxes,
)
from verl_sf.daytona.wire import (
    MAX_MINUTES,
    CreateSandbox,
    Labels,
    error,
    gib,
    http_error,
    json_body,
    refused,
    sandbox_dto,
)
from verl_sf.e2b.sandboxes import GuestError, SandboxGone
from verl_sf.executor import Overloaded, closed
from verl_sf.json_body import load_json
from verl_sf.pages import BadCursor, page
from verl_sf.tenancy import key_accepted, owner_of

API = "/api"
TOOLBOX = "/api/toolbox"
DEFAULT_USER = "daytona"
LIST_LIMIT = 100
LANGUAGES = ("python", "javascript", "typescript")


def api_key(request: web.Request, config: DaytonaConfig) -> str:
    """The caller's key from `Authorization: Bearer`; a 401 raised when it is missing or wrong."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise http_error(401, "missing API key: send `Authorization: Bearer <key>` (DAYTONA_API_KEY)")
    if not key_accepted(config.api_key, key):
        raise http_error(401, "invalid API key: printable ASCII, and the server's own if it requires one")
    return key


def find(request: web.Request, sandboxes: DaytonaSandboxes, config: DaytonaConfig) -> DaytonaSandbox:
    """The caller's sandbox named in the path; a 404 raised for another key's, as for a missing one."""
    key = api_key(request, config)
    try:
        return sandboxes.find(request.match_info["sandbox"], key)
    except NotFound as exc:
        raise http_error(404, str(exc)) from None


def image_environment(build_info: Optional[dict[str, Any]]) -> dict[str, str]:
    """The environment an image to build (`CreateSandboxFromImageParams`) asks for.  Nothing is built:
    the server's runtime stands in for any base (FROM), ENV is honoured, and any other step is refused
    (ValueError naming it) rather than silently skipped."""
    if not build_info:
        return {}
    if build_info.get("contextHashes"):
        raise ValueError("files for the image (contextHashes) cannot be used: nothing is built here")
    dockerfile = build_info.get("dockerfileContent") or ""
    if not isinstance(dockerfile, str):
        raise ValueError("must be a string")
    env: dict[str, str] = {}
    for number, line in enumerate(dockerfile.splitlines(), 1):
        instruction, _, rest = line.strip().partition(" ")
        if not instruction or instruction.startswith("#") or instruction.upper() in ("FROM", "LABEL", "ARG"):
            continue
        if instruction.upper() != "ENV":
            raise ValueError(f"line {number} ({line.strip()[:60]!r}): verl-sf builds no images; only FROM (the "
                             f"server's runtime stands in for it) and ENV are honoured")
        try:
            words = shlex.split(rest)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if words and "=" not in words[0]:  # the legacy form, `ENV KEY a value`
            env[words[0]] = " ".join(words[1:])
        else:
            for word in words:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def list_limit(request: web.Request) -> Optional[int]:
    """GET /api/sandbox's page size: `limit`, LIST_LIMIT without one; None for one that is not a positive integer."""
    raw = request.query.get("limit") or str(LIST_LIMIT)
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 and int(raw) > 0 else None


def paged_list(listed: list[dict[str, Any]], cursor: Optional[str], limit: int) -> web.Response:
    """GET /api/sandbox's answer: a page of `listed` in creation order, and the cursor of the next when more follow."""
    try:
        shown, after = page(listed, lambda s: (s["createdAt"], s["id"]), cursor, limit)
    except BadCursor as exc:
        return error(400, f"cursor: {exc}")
    return web.json_response({"items": shown, "nextCursor": after})


def toolbox_url(request: web.Request) -> str:
    return f"{request.url.origin()}{TOOLBOX}"


class ControlPlane:
    def __init__(self, sandboxes: DaytonaSandboxes, config: DaytonaConfig):
        self.sandboxes = sandboxes
        self.config = config

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(f"{API}/sandbox", self.create)
        app.router.add_get(f"{API}/sandbox", self.list)
        one = f"{API}/sandbox/{{sandbox}}"
        app.router.add_get(one, self.get)
        app.router.add_delete(one, self.delete)
        app.router.add_get(f"{one}/toolbox-proxy-url", self.toolbox_proxy_url)
        app.router.add_post(f"{one}/start", self.start)
        app.router.add_post(f"{one}/stop", self.stop)
        app.router.add_put(f"{one}/labels", self.set_labels)
        app.router.add_post(f"{one}/autostop/{{interval}}", self.set_auto_stop)
        app.router.add_post(f"{one}/autodelete/{{interval}}", self.set_auto_delete)
        app.router.add_post(f"{one}/autoarchive/{{interval}}", self.set_auto_archive)
        app.router.add_post(f"{one}/last-activity", self.last_activity)
        app.router.add_route("*", f"{one}/{{action:.*}}", self.unimplemented)

    def _find(self, request: web.Request) -> DaytonaSandbox:
        return find(request, self.sandboxes, self.config)

    def _dto(self, request: web.Request, sandbox: DaytonaSandbox, state: Optional[str] = None) -> web.Response:
        return web.json_response(sandbox_dto(sandbox, toolbox_url(request), state))

    async def create(self, request: web.Request) -> web.Response:
        key = api_key(request, self.config)
        body = await json_body(request, CreateSandbox)
        assert isinstance(body, CreateSandbox)
        refusal = self._refused(body)
        if refusal is not None:
            return refusal
        try:
            image_env = image_environment(body.build_info)
        except ValueError as exc:
            return error(422, f"buildInfo.dockerfileContent: {exc}")
        executor = self.sandboxes.boxes.executor.config
        auto_stop = self.config.auto_stop_min if body.auto_stop_interval is None else body.auto_stop_interval
        spec = Spec(name=body.name or "", labels=dict(body.labels), env={**image_env, **body.env},
                    snapshot=body.snapshot,
                    user=body.user or DEFAULT_USER, public=body.public, cpu=body.cpu or 1, gpu=body.gpu or 0,
                    memory=body.memory or gib(executor.default_memory_mb),
                    disk=body.disk or gib(executor.workdir_size_mb), auto_stop_min=auto_stop,
                    auto_delete_min=-1 if body.auto_delete_interval is None else body.auto_delete_interval)
        spec.labels.setdefault(LANGUAGE_LABEL, "python")
        try:
            sandbox = await self.sandboxes.create(owner_of(key), spec)
        except NameTaken as exc:
            return error(409, str(exc))
        except (TooManySandboxes, Overloaded) as exc:
            return refused(request, exc, f"server overloaded: {exc}")
        except (GuestError, SandboxGone) as exc:
            return error(500, f"the sandbox could not start: {exc}")
        return self._dto(request, sandbox)

    def _refused(self, body: CreateSandbox) -> Optional[web.Response]:
        language = body.labels.get(LANGUAGE_LABEL, "python")
        if language not in LANGUAGES:
            return error(422, f"labels.{LANGUAGE_LABEL}: {language!r} is not one of {', '.join(LANGUAGES)}")
        if body.volumes:
            return error(422, "volumes: volumes are not implemented by verl-sf")
        if body.auto_pause_interval:
            return error(422, "autoPauseInterval: pausing sandboxes is not implemented by verl-sf")
        return None

    async def get(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        self.sandboxes.refresh(sandbox)
        return self._dto(request, sandbox)

    async def list(self, request: web.Request) -> web.Response:
        key = api_key(request, self.config)
        labels: dict[str, Any] = {}
        raw = request.query.get("labels")
        if raw:
            try:
                labels = load_json(raw)
            except ValueError:
                labels = None  # type: ignore[assignment]
            if not isinstance(labels, dict):
                return error(400, "labels: must be a JSON object of strings")
        limit = list_limit(request)
        if limit is None:
            return error(400, "limit: must be a positive integer")
        wanted_states = request.query.getall("states", [])
        found = [s for s in self.sandboxes.owned(key)
                 if all(s.spec.labels.get(k) == v for k, v in labels.items())]
        for sandbox in found:
            self.sandboxes.refresh(sandbox)
        if wanted_states:
            found = [s for s in found if s.state.value in wanted_states]
        url = toolbox_url(request)
        return paged_list([sandbox_dto(s, url) for s in found], request.query.get("cursor"), limit)

    async def delete(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        await closed(self.sandboxes.delete(sandbox))
        return self._dto(request, sandbox, state="destroyed")

    async def toolbox_proxy_url(self, request: web.Request) -> web.Response:
        self._find(request)
        return web.json_response({"url": toolbox_url(request)})

    async def start(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        try:
            await self.sandboxes.start_again(sandbox)
        except (TooManySandboxes, Overloaded) as exc:
            return refused(request, exc, f"server overloaded: {exc}")
        except (GuestError, SandboxGone) as exc:
            return error(500, f"the sandbox could not start: {exc}")
        return self._dto(request, sandbox)

    async def stop(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        await closed(self.sandboxes.stop(sandbox))
        if sandbox.spec.auto_delete_min == 0:  # an ephemeral sandbox goes as it stops
            self.sandboxes.delete(sandbox)
            return self._dto(request, sandbox, state="destroyed")
        return self._dto(request, sandbox)

    async def set_labels(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        body = await json_body(request, Labels)
        assert isinstance(body, Labels)
        language = sandbox.spec.labels.get(LANGUAGE_LABEL)
        sandbox.spec.labels = dict(body.labels)
        if language is not None:
            sandbox.spec.labels.setdefault(LANGUAGE_LABEL, language)
        return web.json_response({"labels": sandbox.spec.labels})

    def _interval(self, request: web.Request, lowest: int) -> int:
        raw = request.match_info["interval"]
        try:
            value = int(raw)
        except ValueError:
            value = lowest - 1
        if not lowest <= value <= MAX_MINUTES:
            raise http_error(400, f"interval: must be an integer from {lowest} to {MAX_MINUTES}, got {raw[:32]!r}")
        return value

    async def set_auto_stop(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        sandbox.spec.auto_stop_min = self._interval(request, 0)
        sandbox.touch()
        return self._dto(request, sandbox)

    async def set_auto_delete(self, request: web.Request) -> web.Response:
        sandbox = self._find(request)
        sandbox.spec.auto_delete_min = self._interval(request, -1)
        return self._dto(request, sandbox)

    async def set_auto_archive(self, request: web.Request) -> web.Response:
        """Accepted and ignored: nothing is archived here (a stopped sandbox keeps no files)."""
        sandbox = self._find(request)
        self._interval(request, 0)
        return self._dto(request, sandbox)

    async def last_activity(self, request: web.Request) -> web.Response:
        self._find(request).touch()
        return web.Response(status=201)

    async def unimplemented(self, request: web.Request) -> web.Response:
        self._find(request)
        return error(501, f"{request.method} {request.path} is not implemented by verl-sf (docs/daytona.md lists "
                          f"what is)")
