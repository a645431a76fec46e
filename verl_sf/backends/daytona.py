"""`backend: daytona`: Daytona cloud sandboxes through the `daytona` SDK's `AsyncDaytona`.

One sandbox per trajectory (a *session*: verl's `agent_data.request_id`), created on the
trajectory's first call, reused across its turns (files and installed packages persist,
as in a notebook), deleted when the trajectory ends.  Every sandbox carries labels that
`reap_leaked_sandboxes` uses to delete the ones a crashed run left behind; Daytona's own
auto-stop/auto-delete intervals are the last backstop.

Each run is one command in the sandbox's shell session: the code is shipped base64-encoded,
run under `timeout` (the run's time limit) and `ulimit -v` (its memory limit) in a
subshell, and stdout/stderr come back separately from the session API.

Tested through the real SDK against `verl-sf serve`'s Daytona API (tests/integration/
test_backend_daytona.py); Daytona's cloud itself cannot be reached from the test machines.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shlex
import time
import uuid
from typing import Any, ClassVar, Literal, Optional

from pydantic import Field

from verl_sf.backends.base import BackendConfigBase, SandboxBackend, SandboxUnavailable, created_or_none
from verl_sf.models import CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus

log = logging.getLogger(__name__)

# Labels on every sandbox we create; the reaper selects on LABEL_MANAGED.
LABEL_MANAGED = "verl-sf"
LABEL_CREATED = "verl-sf-created"  # unix seconds
LABEL_RUN = "verl-sf-run"  # one id per backend object (i.e. per training process)
LABEL_SESSION = "verl-sf-session"

SESSION_SHELL = "verl-sf"  # the Daytona shell session each sandbox runs our commands in
GRACE_S = 30  # slack on top of the run's time limit before the API call itself is abandoned
TIMEOUT_EXIT_CODES = (124, 137)  # `timeout` after TERM, and after the KILL that follows it

# How each supported language is run, given the path of its source file.
INTERPRETERS = {"python": "python3 -u {path}", "bash": "bash {path}", "nodejs": "node {path}"}
SUFFIXES = {"python": ".py", "bash": ".sh", "nodejs": ".js"}


class DaytonaBackendConfig(BackendConfigBase):
    """`backend: daytona`: the yaml's `daytona:` block.  Credentials come from the SDK's own environment
    variables (DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET), never from the yaml."""

    type: Literal["daytona"] = "daytona"
    default_session: ClassVar[str] = "trajectory"
    snapshot: Optional[str] = None
    """Snapshot to create sandboxes from (the SDK's default python snapshot when unset)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels; the verl-sf labels the reaper selects on are always added."""
    auto_stop_interval: int = Field(15, ge=0)
    """Minutes of inactivity before Daytona stops a sandbox: the backstop for leaked ones."""
    auto_delete_interval: int = Field(0, ge=-1)
    """Minutes after stopping before Daytona deletes it (0: at once, -1: never)."""
    create_timeout: float = Field(60, gt=0)

    def build(self) -> DaytonaSandboxBackend:
        return DaytonaSandboxBackend(self)


class DaytonaSandboxBackend(SandboxBackend):
    """Runs requests in Daytona sandboxes, one per session, created lazily.

    `client` is an `AsyncDaytona` (created on first use from the SDK's environment
    variables when not given).  `run_code(request, session=key)` runs in the session's
    sandbox; without a session a sandbox is created for the one call and deleted after it.
    """

    name = "daytona"
    supports_sessions = True

    def __init__(self, config: Optional[DaytonaBackendConfig] = None, client: Any = None):
        self.config = config or DaytonaBackendConfig()
        self.run_id = uuid.uuid4().hex[:12]
        self._client = client
        self._sandboxes: dict[str, asyncio.Task] = {}  # session -> task creating (then holding) its sandbox
        self._work_dirs: dict[str, str] = {}

    # ---- sandboxes -------------------------------------------------------------------
    def _daytona(self) -> Any:
        if self._client is None:
            from daytona import AsyncDaytona

            self._client = AsyncDaytona()
        return self._client

    def labels(self, session: str) -> dict[str, str]:
        return {**self.config.labels, LABEL_MANAGED: "true", LABEL_RUN: self.run_id,
                LABEL_CREATED: str(int(time.time())), LABEL_SESSION: session[:63]}

    async def _create(self, session: str) -> Any:
        from daytona import CreateSandboxFromSnapshotParams

        params = CreateSandboxFromSnapshotParams(
            language="python", snapshot=self.config.snapshot, labels=self.labels(session),
            auto_stop_interval=self.config.auto_stop_interval, auto_delete_interval=self.config.auto_delete_interval,
        )
        sandbox = await self._daytona().create(params, timeout=self.config.create_timeout)
        try:
            await sandbox.process.create_session(SESSION_SHELL)
            self._work_dirs[sandbox.id] = await sandbox.get_work_dir()
        except BaseException:
            await self._delete(sandbox)
            raise
        return sandbox

    async def _sandbox(self, session: str) -> Any:
        task = self._sandboxes.get(session)
        if task is None:
            task = self._sandboxes[session] = asyncio.ensure_future(self._create(session))
        try:
            return await asyncio.shield(task)
        except Exception as exc:
            if self._sandboxes.get(session) is task:
                del self._sandboxes[session]
            raise SandboxUnavailable(f"daytona: could not create a sandbox: {exc}") from exc

    async def _delete(self, sandbox: Any) -> None:
        self._work_dirs.pop(sandbox.id, None)
        try:
            await self._daytona().delete(sandbox)
        except Exception as exc:  # the labels let the reaper finish the job
            log.warning("daytona: could not delete sandbox %s (the reaper will): %s", sandbox.id, exc)

    async def end_session(self, session: str) -> None:
        """Delete the session's sandbox (waiting for its creation if that is under way)."""
        sandbox = await created_or_none(self._sandboxes.pop(session, None))
        if sandbox is not None:
            await self._delete(sandbox)

    def sessions(self) -> list[str]:
        return list(self._sandboxes)

    # ---- runs ------------------------------------------------------------------------
    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        if request.language not in INTERPRETERS:
            return RunCodeResponse(status=RunStatus.SandboxError,
                                   message=f"language {request.language!r} is not supported by the daytona backend "
                                           f"(supported: {', '.join(INTERPRETERS)})")
        if session is None:
            one_off = f"call-{uuid.uuid4().hex}"
            try:
                return await self._run_in(one_off, request)
            finally:
                await self.end_session(one_off)
        return await self._run_in(session, request)

    async def _run_in(self, session: str, request: RunCodeRequest) -> RunCodeResponse:
        from daytona import SessionExecuteRequest

        sandbox = await self._sandbox(session)
        work_dir = self._work_dirs[sandbox.id]
        try:
            for path, content in request.files.items():
                await sandbox.fs.upload_file(base64.b64decode(content or ""), f"{work_dir}/{path}")
            command = build_command(request, work_dir)
            started = time.monotonic()
            result = await sandbox.process.execute_session_command(
                SESSION_SHELL, SessionExecuteRequest(command=command, run_async=False),
                timeout=int(request.run_timeout + GRACE_S))
            elapsed = time.monotonic() - started
            files = {path: base64.b64encode(await sandbox.fs.download_file(f"{work_dir}/{path}")).decode()
                     for path in request.fetch_files}
        except Exception as exc:
            # A sandbox that failed a call (stopped, deleted, unreachable) is not reused.
            if self._sandboxes.get(session) is not None:
                await self.end_session(session)
            raise SandboxUnavailable(f"daytona: {exc}") from exc
        return to_response(result.exit_code, result.stdout, result.stderr, elapsed, files, sandbox.id)

    async def close(self) -> None:
        await asyncio.gather(*(self.end_session(s) for s in list(self._sandboxes)))
        client, self._client = self._client, None
        if client is not None:
            await client.close()


def build_command(request: RunCodeRequest, work_dir: str) -> str:
    """One shell command: write the source, run it with the limits, in a subshell.

    The subshell keeps `cd` and `ulimit` from leaking into the persistent session shell.
    """
    source = f"{work_dir}/.verl-sf/run-{uuid.uuid4().hex}{SUFFIXES[request.language]}"
    encoded = base64.b64encode(request.code.encode()).decode()
    stdin = base64.b64encode((request.stdin or "").encode()).decode()
    steps = [
        f"mkdir -p {shlex.quote(work_dir)}/.verl-sf",
        f"cd {shlex.quote(work_dir)}",
        f"printf %s {encoded} | base64 -d > {shlex.quote(source)}",
    ]
    if request.memory_limit_MB != -1:
        steps.append(f"ulimit -v {request.memory_limit_MB * 1024}")
    run = INTERPRETERS[request.language].format(path=shlex.quote(source))
    steps.append(f"printf %s {stdin} | base64 -d | timeout -k 1 {request.run_timeout:g} {run}")
    return f"({' && '.join(steps)}; rc=$?; rm -f {shlex.quote(source)}; exit $rc)"


def to_response(exit_code: Optional[int], stdout: Optional[str], stderr: Optional[str], elapsed: float,
                files: dict[str, str], pod: str) -> RunCodeResponse:
    """Sandbox Fusion's response for one finished command (execution_time is client-side wall time)."""
    timed_out = exit_code in TIMEOUT_EXIT_CODES
    run = CommandRunResult(status=CommandRunStatus.TimeLimitExceeded if timed_out else CommandRunStatus.Finished,
                           execution_time=elapsed, return_code=exit_code, stdout=stdout or "", stderr=stderr or "")
    ok = exit_code == 0
    return RunCodeResponse(status=RunStatus.Success if ok else RunStatus.Failed,
                           message="" if ok else ("time limit exceeded" if timed_out else f"exit code {exit_code}"),
                           run_result=run, executor_pod_name=pod, files=files)


async def reap_leaked_sandboxes(client: Any = None, *, older_than_s: float = 3600.0,
                                run_id: Optional[str] = None, page_size: int = 100) -> list[str]:
    """Delete sandboxes verl-sf created that are older than `older_than_s` (all ages when 0).

    `run_id` restricts it to one backend's sandboxes.  Returns the ids deleted.  Safe to run
    from a cron job or at the start of a training run while no other run is live.
    """
    from daytona import AsyncDaytona, ListSandboxesQuery

    own_client = client is None
    client = client or AsyncDaytona()
    labels = {LABEL_MANAGED: "true", **({LABEL_RUN: run_id} if run_id else {})}
    try:
        # collect first: deleting while paging would shift the pages
        found = [s async for s in client.list(ListSandboxesQuery(labels=labels, limit=page_size))]
        now = time.time()
        deleted = []
        for sandbox in found:
            created = float((sandbox.labels or {}).get(LABEL_CREATED, 0) or 0)
            if now - created >= older_than_s:
                await client.delete(sandbox)
                deleted.append(sandbox.id)
        return deleted
    finally:
        if own_client:
            await client.close()
