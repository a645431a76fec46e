"""An E2B-compatible API on `verl-sf serve`: the unmodified `e2b` and `e2b-code-interpreter` SDKs
work against it with E2B_API_URL and E2B_SANDBOX_URL set to the server's URL (docs/e2b.md).

The control plane is ordinary routes; the data plane (envd on port 49983, the code interpreter
on 49999) shares the server's one port, so a middleware takes every request carrying the SDK's
`E2b-Sandbox-Id` header, checks the sandbox's access token, and hands it to envd or the
interpreter by `E2b-Sandbox-Port`.  A sandbox belongs to the API key that created it
(verl_sf.tenancy): only that key sees it on the control plane, only its tokens reach it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, Union

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from verl_sf.e2b.config import ENVD_PORT, JUPYTER_PORT, E2BConfig
from verl_sf.e2b.connect import ConnectError, unary_error
from verl_sf.e2b.control import ControlPlane
from verl_sf.e2b.envd import Envd
from verl_sf.e2b.interpreter import Interpreter
from verl_sf.e2b.sandboxes import Ended, Sandbox, Sandboxes, SandboxGone
from verl_sf.errors import answer_of
from verl_sf.executor import Executor, Overloaded
from verl_sf.tenancy import token_matches

SANDBOXES_KEY = web.AppKey("e2b_sandboxes", Sandboxes)


def install_e2b(app: web.Application, executor: Executor, config: E2BConfig,
                shared: Optional[Sandboxes] = None) -> None:
    """Add the E2B API to the server's app; its sandboxes end when the app stops.  With `shared`
    (another app's, on the same executor) the app serves those and leaves their lifetime alone."""
    sandboxes = shared or Sandboxes(executor, config)
    app[SANDBOXES_KEY] = sandboxes
    ControlPlane(sandboxes, config).add_routes(app)
    app.middlewares.append(_data_plane(sandboxes, Envd(sandboxes, config), Interpreter(sandboxes, config)))

    async def start(_: web.Application) -> None:
        await sandboxes.start()

    async def stop(_: web.Application) -> None:
        await sandboxes.close()

    if shared is None:
        app.on_startup.append(start)
        app.on_cleanup.append(stop)


def admitted(headers: Mapping[str, str], port: str, record: Union[Sandbox, Ended, None]) -> bool:
    """Whether a request may reach the sandbox `record`: every token it sends is that sandbox's, and
    it sends the one the port asks for (envd: its access token; other ports, such as the code
    interpreter's: either, as the SDK sends the traffic token there and the access token too on
    /execute). Both are compared whatever was sent or found, so the work does not tell ids apart."""
    access, traffic = headers.get("X-Access-Token"), headers.get("E2B-Traffic-Access-Token")
    access_ok = token_matches(record.access_token if record is not None else None, access)
    traffic_ok = token_matches(record.traffic_token if record is not None else None, traffic)
    consistent = (access is None or access_ok) and (traffic is None or traffic_ok)
    return consistent and (access_ok if port == ENVD_PORT else access_ok or traffic_ok)


def _data_plane(sandboxes: Sandboxes, envd: Envd, interpreter: Interpreter) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        sandbox_id = request.headers.get("E2b-Sandbox-Id")
        if sandbox_id is None:
            return await handler(request)
        port = request.headers.get("E2b-Sandbox-Port", ENVD_PORT)
        record = sandboxes.record(sandbox_id)
        if not admitted(request.headers, port, record):
            # The same answer whether the id is another's, ended or never given out.
            sent = "X-Access-Token" in request.headers or "E2B-Traffic-Access-Token" in request.headers
            message = (f"{'wrong' if sent else 'missing'} access token for sandbox {sandbox_id} "
                       f"(X-Access-Token{'' if port == ENVD_PORT else ' or E2B-Traffic-Access-Token'})")
            if request.path.startswith(("/filesystem.", "/process.")):
                return unary_error(ConnectError("unauthenticated", message))
            return web.json_response({"code": 401, "message": message}, status=401)
        try:
            if not isinstance(record, Sandbox):  # its own token, so it is told why it ended
                raise SandboxGone(sandbox_id, record.reason if record is not None else "no such sandbox")
            if port == JUPYTER_PORT:
                return await interpreter.handle(request, record)
            if port == ENVD_PORT:
                return await envd.handle(request, record)
        except SandboxGone as exc:
            if port == JUPYTER_PORT:
                return web.Response(status=404, text=str(exc))
            # E2B's proxy answers 502 with this wording: the SDK's "sandbox not running" error.
            return web.json_response({"code": 502, "message": str(exc)}, status=502)
        except Overloaded as exc:
            answer = answer_of(exc)
            status, headers = answer.status, answer.headers(request.app["retry_after_s"])
            return web.json_response({"code": status, "message": f"server overloaded: {exc}"}, status=status,
                                     headers=headers)
        return web.json_response({"code": 502, "message": f"port {port} is not open in sandbox {sandbox_id}"},
                                 status=502)

    return middleware


__all__ = ["E2BConfig", "SANDBOXES_KEY", "install_e2b"]
