"""An E2B-compatible API on `verl-sf serve`: the unmodified `e2b` and `e2b-code-interpreter` SDKs
work against it with E2B_API_URL and E2B_SANDBOX_URL set to the server's URL (docs/e2b.md).

The control plane is ordinary routes; the data plane (envd on port 49983, the code interpreter
on 49999) shares the server's one port, so a middleware takes every request carrying the SDK's
`E2b-Sandbox-Id` header, checks the sandbox's access token, and hands it to envd or the
interpreter by `E2b-Sandbox-Port`.
"""

from __future__ import annotations

import hmac
from typing import Optional

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.connect import ConnectError, unary_error
from verl_sf.e2b.control import ControlPlane
from verl_sf.e2b.envd import Envd
from verl_sf.e2b.interpreter import Interpreter
from verl_sf.e2b.sandboxes import Sandboxes, SandboxGone
from verl_sf.executor import Executor, Overloaded

ENVD_PORT, JUPYTER_PORT = "49983", "49999"
SANDBOXES_KEY = web.AppKey("e2b_sandboxes", Sandboxes)
TOKENLESS_PATHS = ("/contexts",)
"""The interpreter's context calls: e2b-code-interpreter sends no access token with them (nor does
E2B's own server ask for one); a token that is sent must still be the sandbox's."""


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


def _data_plane(sandboxes: Sandboxes, envd: Envd, interpreter: Interpreter) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        sandbox_id = request.headers.get("E2b-Sandbox-Id")
        if sandbox_id is None:
            return await handler(request)
        port = request.headers.get("E2b-Sandbox-Port", ENVD_PORT)
        rpc = request.path.startswith(("/filesystem.", "/process."))
        try:
            sandbox = sandboxes.get(sandbox_id)
        except SandboxGone as exc:
            if port == JUPYTER_PORT:
                return web.Response(status=404, text=str(exc))
            # E2B's proxy answers 502 with this wording: the SDK's "sandbox not running" error.
            return web.json_response({"code": 502, "message": str(exc)}, status=502)
        token = request.headers.get("X-Access-Token")
        tokenless = port == JUPYTER_PORT and request.path.startswith(TOKENLESS_PATHS) and token is None
        if not tokenless and not hmac.compare_digest((token or "").encode(), sandbox.access_token.encode()):
            problem = "missing" if token is None else "wrong"
            message = f"{problem} access token for sandbox {sandbox_id} (X-Access-Token)"
            if rpc:
                return unary_error(ConnectError("unauthenticated", message))
            return web.json_response({"code": 401, "message": message}, status=401)
        try:
            if port == JUPYTER_PORT:
                return await interpreter.handle(request, sandbox)
            if port == ENVD_PORT:
                return await envd.handle(request, sandbox)
        except SandboxGone as exc:
            return web.json_response({"code": 502, "message": str(exc)}, status=502)
        except Overloaded as exc:
            return web.json_response({"code": 503, "message": f"server overloaded: {exc}"}, status=503,
                                     headers={"Retry-After": "1"})
        return web.json_response({"code": 502, "message": f"port {port} is not open in sandbox {sandbox_id}"},
                                 status=502)

    return middleware


__all__ = ["E2BConfig", "SANDBOXES_KEY", "install_e2b"]
