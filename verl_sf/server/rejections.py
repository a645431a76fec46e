"""The answers the native routes give for the package's typed errors: status, `Retry-After` and a
machine-readable `code` from `errors.ANSWERS`, each counted under its code as the Prometheus reason.
The body keeps FastAPI's `detail` (Sandbox Fusion's clients read it) and adds `code` (and the
error's `reason`, where it has one)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from verl_sf.errors import (
    ForkFailed,
    ForkUnavailable,
    InvalidRequest,
    Overloaded,
    SessionGone,
    SnapshotGone,
    VerlSfError,
    answer_for,
)
from verl_sf.server.requests import get_metrics


def _shown(name: str) -> str:
    """A name a client sent, quoted, and cut short when it is longer than any id the server makes."""
    return repr(name) if len(name) <= 128 else f"{name[:64]!r}... ({len(name)} characters)"


def _detail(exc: VerlSfError) -> Any:
    """What `detail` says, in the words each route has always used."""
    if isinstance(exc, Overloaded):
        return f"server overloaded: {exc}"
    if isinstance(exc, SessionGone):
        return f"session {_shown(exc.session_id)} not found: {exc.reason}"
    if isinstance(exc, SnapshotGone):
        return f"snapshot {_shown(exc.snapshot_id)} not found: {exc.reason}"
    if isinstance(exc, ForkUnavailable):
        return f"this server cannot fork sessions: {exc}"
    if isinstance(exc, InvalidRequest):  # FastAPI's shape for a field
        return [{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}]
    if isinstance(exc, ForkFailed):
        return f"the fork failed: {exc}"
    return str(exc)


def refuse(request: web.Request, exc: Exception, invalid_status: int = 400, count: bool = True) -> web.Response:
    """The answer to one of the package's errors (`invalid_status` for a field the executor refused:
    the routes that predate 422 for it keep 400; `count`: False where the caller counted it already);
    any other exception is raised again."""
    answer = answer_for(exc)
    if answer is None or not isinstance(exc, VerlSfError):
        raise exc
    if count:
        get_metrics(request).rejections.labels(answer.code).inc()
    status = invalid_status if isinstance(exc, InvalidRequest) else answer.status
    headers = answer.headers(request.app["retry_after_s"])
    body = {"detail": _detail(exc), "code": answer.code}
    reason = str(exc) if isinstance(exc, (InvalidRequest, ForkFailed)) else getattr(exc, "reason", None)
    if isinstance(reason, str):  # what a client rebuilds the error from (backends/http.py)
        body["reason"] = reason
    if isinstance(exc, InvalidRequest):
        body["field"] = exc.field
    return web.json_response(body, status=status, headers=headers)


REFUSALS = (VerlSfError,)
"""What a route catches and hands to `refuse`."""
