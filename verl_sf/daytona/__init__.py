"""A Daytona-compatible API on `verl-sf serve`: the unmodified `daytona` SDK works against it with
DAYTONA_API_URL=http://HOST:PORT/api and any DAYTONA_API_KEY (docs/daytona.md).

The control plane is under /api/sandbox; each sandbox's toolbox is under /api/toolbox/{id}, the
`toolboxProxyUrl` every sandbox reports.  A sandbox is one box of the E2B API's kind (a live
python session with the guest agent), owned by the key that created it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Optional

from aiohttp import web

from verl_sf.daytona.config import DaytonaConfig
from verl_sf.daytona.control import ControlPlane
from verl_sf.daytona.interpreter import InterpreterSocket
from verl_sf.daytona.sandboxes import DaytonaSandboxes
from verl_sf.daytona.toolbox import Toolbox
from verl_sf.executor import Executor

DAYTONA_SANDBOXES_KEY = web.AppKey("daytona_sandboxes", DaytonaSandboxes)


def install_daytona(app: web.Application, executor: Executor, config: DaytonaConfig,
                    shared: Optional[DaytonaSandboxes] = None) -> None:
    """Add the Daytona API to the server's app; its sandboxes end when the app stops.  With `shared`
    (another app's, on the same executor) the app serves those and leaves their lifetime alone."""
    sandboxes = shared or DaytonaSandboxes(executor, config)
    app[DAYTONA_SANDBOXES_KEY] = sandboxes
    toolbox = Toolbox(sandboxes, config)
    toolbox.add_interpreter(InterpreterSocket(sandboxes.boxes, config).execute)
    toolbox.add_routes(app)
    ControlPlane(sandboxes, config).add_routes(app)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        await sandboxes.start()
        yield
        await sandboxes.close()

    if shared is None:
        app.cleanup_ctx.append(lifetime)


__all__ = ["DAYTONA_SANDBOXES_KEY", "DaytonaConfig", "DaytonaSandboxes", "install_daytona"]
