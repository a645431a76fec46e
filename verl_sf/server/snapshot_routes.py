"""Fork and snapshot routes: POST /sessions/{id}/fork and /snapshot, GET/DELETE /snapshots[/{id}].

A fork is n new sessions holding an idle session's live state; a snapshot is a frozen copy that
runs nothing and that POST /sessions `{"from_snapshot": id}` starts sessions from.  The executor
does the work; these handlers turn its typed refusals into FastAPI-shaped answers.
"""

from __future__ import annotations

from aiohttp import web

from verl_sf.errors import SnapshotGone
from verl_sf.executor import closed
from verl_sf.models import SessionForkRequest, SnapshotList
from verl_sf.server.rejections import REFUSALS, refuse
from verl_sf.server.requests import get_executor, model_answer, parse


async def fork_session(request: web.Request) -> web.Response:
    """An empty body asks for one fork with the defaults."""
    parsed = SessionForkRequest() if not (await request.read()).strip() else await parse(request, SessionForkRequest)
    if isinstance(parsed, web.Response):
        return parsed
    try:
        forks = await get_executor(request).fork_session(request.match_info["session_id"], parsed)
    except REFUSALS as exc:
        return refuse(request, exc, invalid_status=422)
    return await model_answer(forks, 201)


async def snapshot_session(request: web.Request) -> web.Response:
    try:
        info = await get_executor(request).snapshot_session(request.match_info["session_id"])
    except REFUSALS as exc:
        return refuse(request, exc)
    return await model_answer(info, 201)


async def list_snapshots(request: web.Request) -> web.Response:
    body = SnapshotList(snapshots=get_executor(request).snapshots())
    return await model_answer(body)


async def get_snapshot(request: web.Request) -> web.Response:
    try:
        info = get_executor(request).snapshot_info(request.match_info["snapshot_id"])
    except SnapshotGone as exc:
        return refuse(request, exc)
    return await model_answer(info)


async def delete_snapshot(request: web.Request) -> web.Response:
    snapshot_id = request.match_info["snapshot_id"]
    try:
        await closed(get_executor(request).delete_snapshot(snapshot_id))
    except SnapshotGone as exc:
        return refuse(request, exc)
    return web.json_response({"snapshot_id": snapshot_id, "deleted": True})


async def listing_off(request: web.Request) -> web.Response:
    return web.json_response({"detail": "listing snapshots is off on this server: a snapshot's id is what lets a "
                                        "client use it (start the server with --list-snapshots to list them)"},
                             status=403)


def add_snapshot_routes(app: web.Application, listed: bool) -> None:
    app.router.add_post("/sessions/{session_id}/fork", fork_session)
    app.router.add_post("/sessions/{session_id}/snapshot", snapshot_session)
    app.router.add_get("/snapshots", list_snapshots if listed else listing_off)
    app.router.add_get("/snapshots/{snapshot_id}", get_snapshot)
    app.router.add_delete("/snapshots/{snapshot_id}", delete_snapshot)
