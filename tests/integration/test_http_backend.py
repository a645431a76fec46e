"""HttpSandboxBackend: retry policy against a real scripted HTTP server on 127.0.0.1, and
plain use against a real `verl-sf serve`."""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from tests.server_fixtures import ServerHandle
from verl_sf.backends.base import SandboxUnavailable
from verl_sf.backends.http import HttpSandboxBackend, SandboxRequestRejected
from verl_sf.models import RunCodeRequest, RunJupyterRequest, RunStatus

OK_BODY = {"status": "Success", "message": "", "compile_result": None,
           "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": 0,
                          "stdout": "hi\n", "stderr": ""},
           "executor_pod_name": "scripted", "files": {}}
FAILED_BODY = {**OK_BODY, "status": "Failed",
               "run_result": {**OK_BODY["run_result"], "return_code": 1, "stderr": "Traceback ..."}}
SANDBOX_ERROR_BODY = {**OK_BODY, "status": "SandboxError", "message": "runner crashed", "run_result": None}

REQUEST = RunCodeRequest(code="print('hi')", language="python")
Reply = Callable[[web.Request], "asyncio.Future[web.StreamResponse] | web.StreamResponse"]


class ScriptedServer:
    """Answers the n-th request with the n-th scripted reply (the last one repeats)."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.arrivals: list[tuple[str, float]] = []  # (path, monotonic time)
        self.url = ""

    def script(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.arrivals.clear()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append((request.path, time.monotonic()))
        await request.read()
        reply = self.replies[min(len(self.arrivals), len(self.replies)) - 1]
        result = reply(request)
        return await result if asyncio.iscoroutine(result) else result


def status(code: int, **headers: str) -> Reply:
    return lambda request: web.Response(status=code, text=f"scripted {code}", headers=headers)


def body(payload: dict) -> Reply:
    return lambda request: web.json_response(payload)


def drop_connection() -> Reply:
    async def reply(request: web.Request) -> web.StreamResponse:
        request.transport.close()  # no response at all, like a crashed or restarted server
        # The scripted server's behaviour, not a wait: the close goes out before its handler ends.
        await asyncio.sleep(0.05)
        return web.Response(status=200)
    return reply


def stall(seconds: float) -> Reply:
    async def reply(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)  # the scripted server's behaviour, not a wait: a server that answers late
        return web.json_response(OK_BODY)
    return reply


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    app = web.Application()
    app.router.add_post("/run_code", server.handle)
    app.router.add_post("/run_jupyter", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    yield server
    await runner.cleanup()


def fast_backend(url: str, **kwargs) -> HttpSandboxBackend:
    kwargs.setdefault("backoff_base_s", 0.01)
    kwargs.setdefault("backoff_max_s", 0.05)
    return HttpSandboxBackend(url, **kwargs)


@pytest.mark.parametrize("transient", [503, 429, 502, 504])
async def test_transient_statuses_are_retried_until_success(scripted: ScriptedServer, transient: int) -> None:
    scripted.script(status(transient), status(transient), status(transient), body(OK_BODY))
    backend = fast_backend(scripted.url)
    try:
        response = await backend.run_code(REQUEST)
    finally:
        await backend.close()
    assert response.status == RunStatus.Success and response.run_result.stdout == "hi\n"
    assert len(scripted.arrivals) == 4


async def test_retry_after_is_honoured(scripted: ScriptedServer) -> None:
    scripted.script(status(429, **{"Retry-After": "1"}), status(503, **{"Retry-After": "1"}), body(OK_BODY))
    backend = fast_backend(scripted.url)
    try:
        assert (await backend.run_code(REQUEST)).status == RunStatus.Success
    finally:
        await backend.close()
    times = [t for _, t in scripted.arrivals]
    assert len(times) == 3
    # Lower bounds only: the client may wait longer, never shorter than asked.
    assert times[1] - times[0] >= 1.0 and times[2] - times[1] >= 1.0


async def test_retry_after_beyond_the_limit_gives_up_at_once(scripted: ScriptedServer) -> None:
    scripted.script(status(503, **{"Retry-After": "3600"}))
    backend = fast_backend(scripted.url, max_retry_after_s=5)
    with pytest.raises(SandboxUnavailable, match="Retry-After 3600"):
        await backend.run_code(REQUEST)
    await backend.close()
    assert len(scripted.arrivals) == 1


@pytest.mark.parametrize("verdict", [FAILED_BODY, SANDBOX_ERROR_BODY])
async def test_a_run_that_failed_in_the_sandbox_is_not_retried(scripted: ScriptedServer, verdict: dict) -> None:
    scripted.script(body(verdict), body(OK_BODY))
    backend = fast_backend(scripted.url)
    response = await backend.run_code(REQUEST)
    await backend.close()
    assert response.status.value == verdict["status"]
    assert response.message == verdict["message"]
    assert len(scripted.arrivals) == 1


async def test_out_of_retries_raises_sandbox_unavailable_with_the_reason(scripted: ScriptedServer) -> None:
    scripted.script(status(503))
    backend = fast_backend(scripted.url, max_retries=3)
    with pytest.raises(SandboxUnavailable, match=r"after 4 attempt\(s\); last: HTTP 503"):
        await backend.run_code(REQUEST)
    await backend.close()
    assert len(scripted.arrivals) == 4


async def test_dropped_connection_is_retried(scripted: ScriptedServer) -> None:
    scripted.script(drop_connection(), body(OK_BODY))
    backend = fast_backend(scripted.url)
    assert (await backend.run_code(REQUEST)).status == RunStatus.Success
    await backend.close()
    assert len(scripted.arrivals) == 2


async def test_refused_connection_exhausts_retries() -> None:
    from tests.ray_fixtures import free_port

    backend = fast_backend(f"http://127.0.0.1:{free_port()}/run_code", max_retries=2)
    with pytest.raises(SandboxUnavailable, match=r"after 3 attempt\(s\); last: ClientConnectorError"):
        await backend.run_code(REQUEST)
    await backend.close()


async def test_read_timeout_is_not_retried(scripted: ScriptedServer) -> None:
    scripted.script(stall(3.0))
    backend = fast_backend(scripted.url, server_margin_s=0)
    quick = RunCodeRequest(code="print(1)", language="python", compile_timeout=0.2, run_timeout=0.3)
    with pytest.raises(SandboxUnavailable, match="no answer within 0.5 s"):
        await backend.run_code(quick)
    await backend.close()
    assert len(scripted.arrivals) == 1


@pytest.mark.parametrize("reply, error, match", [
    (status(422), SandboxRequestRejected, "HTTP 422: scripted 422"),
    (status(413), SandboxRequestRejected, "HTTP 413"),
    (status(500), SandboxUnavailable, "HTTP 500: scripted 500"),
    (lambda request: web.Response(text="not json"), SandboxUnavailable, "not a RunCodeResponse"),
    (body({"status": "Maybe"}), SandboxUnavailable, "not a RunCodeResponse"),
])
async def test_answers_that_retrying_cannot_fix(scripted: ScriptedServer, reply, error, match) -> None:
    scripted.script(reply)
    backend = fast_backend(scripted.url)
    with pytest.raises(error, match=match):
        await backend.run_code(REQUEST)
    await backend.close()
    assert len(scripted.arrivals) == 1


async def test_url_forms_and_run_jupyter_paths(scripted: ScriptedServer) -> None:
    jupyter_body = {"status": "Success", "driver": None, "cells": [{"stdout": "2\n"}]}
    paths = []
    for url in (scripted.url, scripted.url + "/", scripted.url + "/run_code"):
        backend = fast_backend(url)
        scripted.script(body(OK_BODY))
        await backend.run_code(REQUEST)
        paths += [path for path, _ in scripted.arrivals]
        scripted.script(body(jupyter_body))
        response = await backend.run_jupyter(RunJupyterRequest(cells=["1 + 1"]))
        paths += [path for path, _ in scripted.arrivals]
        assert response.cells[0].stdout == "2\n"
        await backend.close()
    assert paths == ["/run_code", "/run_jupyter"] * 3


async def test_copies_share_one_session_per_loop_and_close_is_idempotent(scripted: ScriptedServer) -> None:
    scripted.script(body(OK_BODY))
    backend = fast_backend(scripted.url)
    copy = pickle.loads(pickle.dumps(backend))
    await backend.run_code(REQUEST)
    assert copy._session() is backend._session()  # pickling carried no session; the registry did
    await copy.close()
    await backend.close()
    assert (await backend.run_code(REQUEST)).status == RunStatus.Success  # reopens lazily
    await backend.close()


# ---- against the real server ---------------------------------------------------------------

async def test_real_server_success_and_failure(sf_server: ServerHandle) -> None:
    for url in (sf_server.url, sf_server.run_code_url):
        backend = HttpSandboxBackend(url)
        try:
            ok = await backend.run_code(RunCodeRequest(code="print(6 * 7)", language="python"))
            failed = await backend.run_code(RunCodeRequest(code="raise SystemExit(3)", language="python"))
            cells = await backend.run_jupyter(RunJupyterRequest(cells=["x = 20", "print(x + 1)"]))
        finally:
            await backend.close()
        assert ok.status == RunStatus.Success and ok.run_result.stdout == "42\n"
        assert failed.status == RunStatus.Failed and failed.run_result.return_code == 3
        assert cells.status == RunStatus.Success and cells.cells[1].stdout == "21\n"
