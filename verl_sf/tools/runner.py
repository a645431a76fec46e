"""What runs where: picklable backend specs, and the functions the execution pool runs.

The tool object lives in a verl rollout worker; its executions run in that process (the
default) or inside an execution-pool actor (`pool: ray_actor`).  So the tool hands the pool
a small picklable `BackendSpec` plus the request, and the process that runs it keeps one
backend per spec and event loop (`backend_for`): HTTP connections, the local executor's
warm slots and Daytona sandboxes are set up once, not per call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import weakref
from typing import Any, Optional

from verl_sf.backends.base import SandboxBackend
from verl_sf.backends.daytona import DaytonaOptions, DaytonaSandboxBackend
from verl_sf.models import RunCodeRequest, RunCodeResponse


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """Everything needed to build a backend in another process (plain, hashable data)."""

    kind: str  # "http" | "local" | "daytona" | "cluster"
    url: Optional[str] = None
    options_json: str = "{}"  # the `http:`, `local:`, `daytona:` or `cluster:` block, canonical JSON

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)

    def build(self) -> SandboxBackend:
        if self.kind == "http":
            from verl_sf.backends.http import HttpSandboxBackend

            return HttpSandboxBackend(self.url, **self.options)
        if self.kind == "local":
            from verl_sf.backends.local import LocalSandboxBackend

            return LocalSandboxBackend(self.options)
        if self.kind == "daytona":
            return DaytonaSandboxBackend(DaytonaOptions(**self.options))
        if self.kind == "cluster":
            from verl_sf.backends.cluster import ClusterSandboxBackend

            return ClusterSandboxBackend(**self.options)
        raise ValueError(f"unknown backend kind {self.kind!r}")


# One backend per (event loop, spec) in each process.  Keyed weakly on the loop: a
# backend's connections belong to the loop that opened them.
_BACKENDS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[BackendSpec, SandboxBackend]]" = (
    weakref.WeakKeyDictionary())


def backend_for(spec: BackendSpec) -> SandboxBackend:
    per_loop = _BACKENDS.setdefault(asyncio.get_running_loop(), {})
    backend = per_loop.get(spec)
    if backend is None:
        backend = per_loop[spec] = spec.build()
    return backend


@dataclasses.dataclass
class Execution:
    """A response plus when the executing process started on it (after the limiter's permit)."""

    response: RunCodeResponse
    started_at: float  # time.time() in the executing process


async def run_request(spec: BackendSpec, request: RunCodeRequest, session: Optional[str] = None) -> Execution:
    """Pool function: run one request on this process's backend for `spec`."""
    started_at = time.time()
    backend = backend_for(spec)
    if session is not None and isinstance(backend, DaytonaSandboxBackend):
        response = await backend.run_code(request, session=session)
    else:
        response = await backend.run_code(request)
    return Execution(response, started_at)


async def end_session(spec: BackendSpec, session: str) -> None:
    """Pool function: release what a session holds (a Daytona sandbox); no-op elsewhere."""
    backend = backend_for(spec)
    if isinstance(backend, DaytonaSandboxBackend):
        await backend.end_session(session)


async def close_backend(spec: BackendSpec) -> None:
    """Pool function: close this process's backend for `spec` (sandboxes, slots, connections)."""
    backend = _BACKENDS.get(asyncio.get_running_loop(), {}).pop(spec, None)
    if backend is not None:
        await backend.close()
