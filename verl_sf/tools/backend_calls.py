"""What runs where: the functions the tool's dispatcher runs, one backend per config and loop.

The tool object lives in a verl rollout worker; its executions run in that process (the
default) or inside an execution-pool actor (`pool: ray_actor`).  So the tool hands its dispatcher
its small `BackendConfig` plus the request, and the process that runs it keeps one
backend per config and event loop (`backend_for`, keyed on `config.key()`): HTTP connections, the local executor's
warm slots and Daytona sandboxes are set up once, not per call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from typing import Optional
from uuid import uuid4

from verl_sf.backends.base import SandboxBackend
from verl_sf.backends.config import BackendConfig
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus, SnapshotInfo
from verl_sf.tools import reply
from verl_sf.tools.setup import SetupFailed

# One backend per (event loop, config) in each process.  Keyed weakly on the loop: a
# backend's connections belong to the loop that opened them.
_BACKENDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SandboxBackend]] = (
    weakref.WeakKeyDictionary())


def backend_for(config: BackendConfig) -> SandboxBackend:
    per_loop = _BACKENDS.setdefault(asyncio.get_running_loop(), {})
    backend = per_loop.get(config.key())
    if backend is None:
        backend = per_loop[config.key()] = config.build()
    return backend


@dataclasses.dataclass
class Execution:
    """A response plus when the executing process started on it (after the limiter's permit)."""

    response: RunCodeResponse
    started_at: float  # time.time() in the executing process


async def run_request(config: BackendConfig, request: RunCodeRequest, session: Optional[str] = None,
                      from_snapshot: Optional[SnapshotInfo] = None) -> Execution:
    """Dispatched: run one request on this process's backend for `config`; a `session` not open yet starts
    from `from_snapshot` (in its language; `SnapshotGone` when the server no longer has it)."""
    started_at = time.time()
    backend = backend_for(config)
    if session is not None and from_snapshot is not None:
        await backend.open_session(session, from_snapshot.language, from_snapshot=from_snapshot.snapshot_id)
    response = await backend.run_code(request, session=session)
    return Execution(response, started_at)


async def build_snapshot(config: BackendConfig, setup: RunCodeRequest, max_output_chars: int) -> SnapshotInfo:
    """Dispatched: run `setup` in a session of its own and snapshot it; `SetupFailed` (the set-up's own
    output) when it does not succeed.  The session ends either way: only the snapshot is kept."""
    backend = backend_for(config)
    session = f"setup-{uuid4().hex}"
    try:
        response = await backend.run_code(setup, session=session)
        if response.status != RunStatus.Success:
            text, _ = reply.reply_text(response, setup.run_timeout, max_output_chars)
            raise SetupFailed(f"the row's set-up did not succeed ({reply.status_of(response)}): {text}")
        return await backend.snapshot_session(session, language=setup.language)  # type: ignore[arg-type]
    finally:
        await backend.end_session(session)


async def delete_snapshot(config: BackendConfig, snapshot_id: str) -> None:
    """Dispatched: delete a snapshot (one already gone is not an error)."""
    await backend_for(config).delete_snapshot(snapshot_id)


async def end_session(config: BackendConfig, session: str) -> None:
    """Dispatched: release what a session holds (a no-op on backends without sessions)."""
    await backend_for(config).end_session(session)


async def check_sessions(config: BackendConfig) -> None:
    """Dispatched: raise `SessionsUnsupported` unless this process's backend for `config` keeps sessions."""
    await backend_for(config).check_sessions()


async def close_backend(config: BackendConfig) -> None:
    """Dispatched: close this process's backend for `config` (sandboxes, slots, connections)."""
    backend = _BACKENDS.get(asyncio.get_running_loop(), {}).pop(config.key(), None)
    if backend is not None:
        await backend.close()
