"""What the Daytona API reads and answers: request bodies (pydantic, camelCase as the SDK sends
them), the sandbox as the SDK parses it, and NestJS's error envelope."""

from __future__ import annotations

import datetime
import math
from typing import Any, Optional

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from verl_sf.daytona.sandboxes import DaytonaSandbox
from verl_sf.errors import InputError, VerlSfError, answer_of
from verl_sf.json_body import JsonBodyError, request_json
from verl_sf.validation import Environment, Metadata, first_error

ORGANIZATION_ID = "verl-sf"
TARGET = "local"
DAEMON_VERSION = "verl-sf"
SOURCE_DAEMON = "DAYTONA_DAEMON"  # the SDK's source for errors of the sandbox's own daemon
STATUS_NAMES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 408: "Request Timeout",
                409: "Conflict", 413: "Payload Too Large", 422: "Unprocessable Entity", 500: "Internal Server Error",
                501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout", 507: "Insufficient Storage"}


def error(status: int, message: str, code: Optional[str] = None, headers: Optional[dict[str, str]] = None,
          source: Optional[str] = None) -> web.Response:
    """NestJS's envelope, which the SDK reads `message` (and `code`, `source`) from."""
    body: dict[str, Any] = {"statusCode": status, "message": message, "error": STATUS_NAMES.get(status, "Error")}
    if code is not None:
        body.update(code=code, source=source or SOURCE_DAEMON)
    return web.json_response(body, status=status, headers=headers)


def refused(request: web.Request, exc: VerlSfError, message: str) -> web.Response:
    """One of the package's errors in NestJS's envelope, with the status and Retry-After of `errors.ANSWERS`."""
    answer = answer_of(exc)
    return error(answer.status, message, headers=answer.headers(request.app["retry_after_s"]))


MAX_MINUTES = 2**31 - 1  # an int32, as Daytona types its intervals


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class CreateSandbox(Body):
    """POST /api/sandbox."""

    name: Optional[StrictStr] = Field(default=None, min_length=1, max_length=255, pattern=r"^[^\x00]*$")
    snapshot: Optional[StrictStr] = None
    user: Optional[StrictStr] = None
    env: Environment = Field(default_factory=dict)
    labels: Metadata = Field(default_factory=dict)
    public: StrictBool = False
    network_block_all: Optional[StrictBool] = Field(default=None, alias="networkBlockAll")
    network_allow_list: Optional[StrictStr] = Field(default=None, alias="networkAllowList")
    domain_allow_list: Optional[StrictStr] = Field(default=None, alias="domainAllowList")
    target: Optional[StrictStr] = None
    cpu: Optional[StrictInt] = Field(default=None, ge=1)
    gpu: Optional[StrictInt] = Field(default=None, ge=0)
    memory: Optional[StrictInt] = Field(default=None, ge=1)
    disk: Optional[StrictInt] = Field(default=None, ge=1)
    auto_stop_interval: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_MINUTES, alias="autoStopInterval")
    auto_pause_interval: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_MINUTES, alias="autoPauseInterval")
    auto_archive_interval: Optional[StrictInt] = Field(default=None, ge=0, le=MAX_MINUTES, alias="autoArchiveInterval")
    auto_delete_interval: Optional[StrictInt] = Field(default=None, ge=-1, le=MAX_MINUTES, alias="autoDeleteInterval")
    volumes: list[Any] = Field(default_factory=list)
    build_info: Optional[dict[str, Any]] = Field(default=None, alias="buildInfo")


class Labels(Body):
    labels: Metadata  # the cap creation has (red team, 2026-11-30: 50 MB of labels set after it)


class BadBody(InputError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse(model: type[Body], body: Any) -> Body:
    """The body as `model`; BadBody (400 for a body that is not an object, 422 naming the field for
    one that does not fit) otherwise."""
    if not isinstance(body, dict):
        raise BadBody(400, "the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BadBody(422, first_error(exc)) from None


async def json_body(request: web.Request, model: type[Body]) -> Body:
    """The request's body as `model`; web.HTTPException with Daytona's envelope otherwise."""
    try:
        body = await request_json(request) if request.body_exists else {}
    except JsonBodyError as exc:
        raise http_error(400, str(exc)) from None
    try:
        return parse(model, body)
    except BadBody as exc:
        raise http_error(exc.status, str(exc)) from None


def http_error(status: int, message: str) -> web.HTTPException:
    """Daytona's error envelope as an exception a route raises."""
    exception = web.HTTPException(text=error(status, message).text, content_type="application/json")
    exception.set_status(status)
    return exception


def iso(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def gib(mb: int) -> int:
    return max(1, math.ceil(mb / 1024))


def sandbox_dto(sandbox: DaytonaSandbox, toolbox_url: str, state: Optional[str] = None) -> dict[str, Any]:
    """The sandbox as the SDK's `Sandbox` model parses it (every required field)."""
    spec = sandbox.spec
    return {
        "id": sandbox.id, "organizationId": ORGANIZATION_ID, "name": spec.name, "snapshot": spec.snapshot,
        "user": spec.user, "env": spec.env, "labels": spec.labels, "public": spec.public,
        "networkBlockAll": True, "kvm": False, "target": TARGET, "cpu": spec.cpu, "gpu": spec.gpu,
        "memory": spec.memory, "disk": spec.disk, "state": state or sandbox.state.value,
        "desiredState": state or sandbox.state.value,
        "recoverable": False, "autoStopInterval": spec.auto_stop_min, "autoArchiveInterval": 0,
        "autoDeleteInterval": spec.auto_delete_min, "volumes": [], "createdAt": iso(sandbox.created_at),
        "updatedAt": iso(sandbox.updated_at), "lastActivityAt": iso(sandbox.last_activity),
        "daemonVersion": DAEMON_VERSION, "toolboxProxyUrl": toolbox_url,
    }
