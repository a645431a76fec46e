"""The answers a route gives for the executor's typed refusals, each counted under its Prometheus reason."""

from __future__ import annotations

from aiohttp import web

from verl_sf.errors import ForkUnavailable, SessionBusy, SessionGone, SnapshotGone
from verl_sf.executor import InvalidRequest, Overloaded
from verl_sf.executor.executor import ForkFailed
from verl_sf.server.requests import error, get_metrics


def overloaded(request: web.Request, exc: Overloaded) -> web.Response:
    get_metrics(request).rejections.labels("overloaded").inc()
    retry_after = str(request.app["retry_after_s"])
    return web.json_response({"detail": f"server overloaded: {exc}"}, status=503, headers={"Retry-After": retry_after})


def session_not_found(request: web.Request, exc: SessionGone) -> web.Response:
    get_metrics(request).rejections.labels("session_not_found").inc()
    return error(404, f"session {exc.session_id!r} not found: {exc.reason}")


def snapshot_not_found(request: web.Request, exc: SnapshotGone) -> web.Response:
    get_metrics(request).rejections.labels("snapshot_not_found").inc()
    return error(404, f"snapshot {exc.snapshot_id!r} not found: {exc.reason}")


def session_busy(request: web.Request, exc: SessionBusy) -> web.Response:
    get_metrics(request).rejections.labels("session_busy").inc()
    return error(409, str(exc))


def fork_unavailable(request: web.Request, exc: ForkUnavailable) -> web.Response:
    get_metrics(request).rejections.labels("fork_unavailable").inc()
    return error(501, f"this server cannot fork sessions: {exc}")


def fork_failed(request: web.Request, exc: ForkFailed) -> web.Response:
    """The sandbox could not make the copies (none is left): the server's failure, not the request's."""
    get_metrics(request).rejections.labels("fork_failed").inc()
    return error(500, f"the fork failed: {exc}")


def invalid(request: web.Request, exc: InvalidRequest, status: int = 400) -> web.Response:
    """FastAPI's shape for a field the executor refused (the routes that predate 422 for it keep 400)."""
    get_metrics(request).rejections.labels("invalid").inc()
    return error(status, [{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}])


REFUSALS = (SessionGone, SnapshotGone, SessionBusy, Overloaded, ForkUnavailable, ForkFailed, InvalidRequest)
"""The executor's typed refusals: what a route catches and hands to `refuse`."""


def refuse(request: web.Request, exc: Exception, invalid_status: int = 400) -> web.Response:
    """The answer to one of REFUSALS (`invalid_status` for a field the executor refused)."""
    if isinstance(exc, SessionGone):
        return session_not_found(request, exc)
    if isinstance(exc, SnapshotGone):
        return snapshot_not_found(request, exc)
    if isinstance(exc, SessionBusy):
        return session_busy(request, exc)
    if isinstance(exc, Overloaded):
        return overloaded(request, exc)
    if isinstance(exc, ForkUnavailable):
        return fork_unavailable(request, exc)
    if isinstance(exc, ForkFailed):
        return fork_failed(request, exc)
    if isinstance(exc, InvalidRequest):
        return invalid(request, exc, invalid_status)
    raise exc
