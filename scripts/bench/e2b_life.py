"""One E2B sandbox's life through plain HTTP, as the SDK sends it (no SDK in the client)."""

from __future__ import annotations

import json
from typing import Any


async def e2b_life(http: Any, url: str, code: str, api_key: str) -> list[dict[str, Any]]:
    """`POST /v2/sandboxes`, `POST /execute` of `code` on the code interpreter's port, `DELETE
    /sandboxes/{id}` on an aiohttp session; the execution's events.  Raises if a step is refused."""
    key = {"X-API-Key": api_key}
    async with http.post(url + "/v2/sandboxes", json={"templateID": "code-interpreter-v1", "timeout": 60},
                         headers=key) as response:
        created = await response.json()
    if response.status != 201:
        raise RuntimeError(f"create answered {response.status}: {created}")
    sandbox = {"E2b-Sandbox-Id": created["sandboxID"], "E2b-Sandbox-Port": "49999",
               "X-Access-Token": created["envdAccessToken"]}
    try:
        async with http.post(url + "/execute", json={"code": code}, headers=sandbox) as response:
            if response.status != 200:
                raise RuntimeError(f"/execute answered {response.status}: {await response.text()}")
            return [json.loads(line) for line in (await response.text()).splitlines()]
    finally:
        async with http.delete(url + "/sandboxes/" + created["sandboxID"], headers=key) as response:
            if response.status != 204:
                raise RuntimeError(f"kill answered {response.status}: {await response.text()}")
