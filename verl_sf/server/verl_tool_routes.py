"""POST /get_observation: verl-tool's tool-server protocol, answered by `verl_sf.verl_tool`'s tool."""

from __future__ import annotations

import time

from aiohttp import web
from pydantic import ValidationError

from verl_sf.errors import Overloaded
from verl_sf.server.rejections import refuse
from verl_sf.server.requests import EXECUTOR_KEY, get_metrics, parse, refused, run_answer, validation_detail
from verl_sf.verl_tool.config import VerlToolConfig
from verl_sf.verl_tool.protocol import GetObservationRequest, GetObservationResponse, ObservationQuery
from verl_sf.verl_tool.tool import PythonCodeTool, build_tool

ENDPOINT = "get_observation"
VERL_TOOL_KEY = web.AppKey("verl_tool", PythonCodeTool)


async def get_observation(request: web.Request) -> web.StreamResponse:
    try:
        query = ObservationQuery.model_validate(dict(request.query))
    except ValidationError as exc:
        return refused(request, 422, "invalid", validation_detail(exc, "query"))
    parsed = await parse(request, GetObservationRequest)
    if isinstance(parsed, web.Response):
        return parsed
    started = time.monotonic()
    outcomes = await request.app[VERL_TOOL_KEY].observe(parsed, query.namespace)
    metrics = get_metrics(request)
    for outcome in outcomes:
        if outcome.refused:
            metrics.rejections.labels("overloaded").inc()
        if outcome.response is not None:
            metrics.record_run(ENDPOINT, "python", outcome.response.status, outcome.response.queue_wait,
                               outcome.seconds)
    if any(outcome.refused for outcome in outcomes) and not any(outcome.ran for outcome in outcomes):
        # Nothing ran, so verl-tool's client may simply send the batch again (errors.ANSWERS' 503).
        return refuse(request, Overloaded("no sandbox slot could be queued for this batch"), count=False)
    body = GetObservationResponse(observations=[outcome.observation for outcome in outcomes],
                                  dones=[outcome.done for outcome in outcomes],
                                  valids=[outcome.valid for outcome in outcomes],
                                  processing_time_ms=(time.monotonic() - started) * 1000)
    return await run_answer(request, body)


def add_verl_tool_routes(app: web.Application, config: VerlToolConfig) -> None:
    """POST /get_observation on an app that has its executor and metrics."""
    app[VERL_TOOL_KEY] = build_tool(config, app[EXECUTOR_KEY])
    app.router.add_post("/get_observation", get_observation)
