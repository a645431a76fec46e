"""The systems the benchmark can drive, each behind verl-sf's own `SandboxBackend` interface.

Every adapter turns its system's answer into a Sandbox Fusion `RunCodeResponse`, so one rule
(`scenarios.classify`) judges all of them alike.  Adapters whose system is absent here (no
Docker engine, no Daytona key) raise `BackendSkipped` from `start()` with the reason, and the
benchmark moves on to the next backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import aiohttp

from bench.scenarios import Kind
from verl_sf.backends.base import SandboxBackend, SessionsUnsupported
from verl_sf.backends.daytona import DaytonaSandboxBackend
from verl_sf.backends.http import HttpSandboxBackend
from verl_sf.backends.local import LocalSandboxBackend
from verl_sf.errors import VerlSfError
from verl_sf.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    summarize_status,
)
from verl_sf.server.process import LISTEN_RE

BACKENDS = ("verl-sf", "local", "subprocess", "sandbox_fusion", "daytona", "docker")
ALIASES = {"sandboxfusion": "sandbox_fusion", "verl_sf": "verl-sf"}  # the guide spells it sandboxfusion


class BackendSkipped(VerlSfError, RuntimeError):
    """This backend cannot run on this machine; the message says why and what would fix it."""


class BenchBackend(SandboxBackend):
    """A `SandboxBackend` the benchmark can also start, and whose memory it can watch."""

    bounds_processes = True  # a run's processes are capped and end with it (the fork-bomb burst needs that)

    async def start(self, max_concurrency: int) -> None:
        """Acquire what `run_code` needs (sessions, servers, sandboxes) for this many calls at once."""

    @property
    def memory_root_pid(self) -> Optional[int]:
        """The process whose tree holds the sandboxes, or None when they live elsewhere."""
        return None

    async def describe(self) -> Optional[dict]:
        """What the system under test says about its configuration, kept in summary.json."""
        return None

    async def supports(self, kind: Kind) -> bool:
        """Whether this system can run a scenario of `kind` (stateless runs: all of them)."""
        return kind == Kind.run

    async def ping(self) -> str:
        """One round trip to the server's /v1/ping; its answer."""
        raise NotImplementedError(f"{self.name} has no /v1/ping")

    @property
    def base_url(self) -> Optional[str]:
        """The server's address, for the session memory probe (GET /sessions/{id})."""
        return None


def _process_response(returncode: int, stdout: bytes, stderr: bytes, elapsed: float,
                      timed_out: bool) -> RunCodeResponse:
    """One finished (or killed) `python -c` process as Sandbox Fusion would report it."""
    run = CommandRunResult(
        status=CommandRunStatus.TimeLimitExceeded if timed_out else CommandRunStatus.Finished,
        execution_time=elapsed, return_code=returncode,
        stdout=stdout.decode(errors="replace"), stderr=stderr.decode(errors="replace"))
    return RunCodeResponse(status=summarize_status(None, run), run_result=run)


async def _run_process(argv: list[str], timeout: float, cwd: Optional[str] = None,
                       on_timeout: Optional[list[str]] = None) -> RunCodeResponse:
    """Run argv with a wall-clock limit; on time-out kill its whole session (and run `on_timeout`)."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
        timed_out = False
    except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):  # it finished in the meantime
            os.killpg(proc.pid, signal.SIGKILL)
        if on_timeout:
            cleanup = await asyncio.create_subprocess_exec(
                *on_timeout, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            await cleanup.wait()
        stdout, stderr = await proc.communicate()
        if isinstance(exc, asyncio.CancelledError):
            raise
        timed_out = True
    return _process_response(proc.returncode if proc.returncode is not None else -9, stdout, stderr,
                             time.perf_counter() - started, timed_out)


class SubprocessBackend(BenchBackend):
    """The naive baseline: a fresh `python -c CODE` per call, no isolation, no queue."""

    name = "subprocess"
    bounds_processes = False

    def __init__(self) -> None:
        self._workdir: Optional[tempfile.TemporaryDirectory] = None

    async def start(self, max_concurrency: int) -> None:
        # Runs write where they stand; keep that out of the user's checkout.
        self._workdir = tempfile.TemporaryDirectory(prefix="verl-sf-bench-")

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        assert self._workdir is not None, "start() first"
        return await _run_process([sys.executable, "-c", request.code], request.run_timeout,
                                  cwd=self._workdir.name)

    @property
    def memory_root_pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None


class DockerBackend(BenchBackend):
    """One `docker run --rm` container per call, the guide's container baseline."""

    name = "docker"
    bounds_processes = False  # `docker run` sets no pids limit

    def __init__(self, image: str, memory: str) -> None:
        self.image, self.memory = image, memory

    async def start(self, max_concurrency: int) -> None:
        if shutil.which("docker") is None:
            raise BackendSkipped("docker: the docker CLI is not on PATH; install Docker to run this baseline")
        proc = await asyncio.create_subprocess_exec(
            "docker", "info", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise BackendSkipped("docker: `docker info` did not answer within 30 s; is the engine running?") from None
        if proc.returncode != 0:
            reason = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise BackendSkipped(f"docker: no Docker engine answers (`docker info` failed: {reason[0]})")

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        name = f"verl-sf-bench-{uuid.uuid4().hex[:12]}"
        argv = ["docker", "run", "--rm", "--name", name, "--network=none", f"--memory={self.memory}",
                "--cpus=1", self.image, "python3", "-c", request.code]
        # Killing the client does not stop the container; remove it by name.
        return await _run_process(argv, request.run_timeout, on_timeout=["docker", "rm", "-f", name])


class Adapter(BenchBackend):
    """One of verl-sf's own backends (what users run) plus the benchmark's start/memory hooks."""

    def __init__(self, name: str, inner: SandboxBackend) -> None:
        self.name, self.inner = name, inner

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        return await self.inner.run_code(request, session=session)

    async def end_session(self, session: str) -> None:
        await self.inner.end_session(session)

    async def supports(self, kind: Kind) -> bool:
        if kind != Kind.session:
            return kind == Kind.run
        try:
            await self.inner.check_sessions()
        except SessionsUnsupported:
            return False
        return True

    async def close(self) -> None:
        await self.inner.close()


class HttpAdapter(Adapter):
    """verl-sf's HTTP client with retries off (a benchmark must see every 503 and reset, not
    hide them behind a retry), one connection per concurrent call (a smaller pool would queue
    calls in the client), and the benchmark's own deadline as the only read limit."""

    def __init__(self, name: str, url: str, max_concurrency: int, client_timeout: float) -> None:
        super().__init__(name, HttpSandboxBackend(url, max_retries=0, connection_limit=max_concurrency,
                                                  server_margin_s=client_timeout))
        self._ping_session: Optional[aiohttp.ClientSession] = None

    @property
    def base_url(self) -> str:
        return self.inner.base_url

    async def supports(self, kind: Kind) -> bool:
        if kind == Kind.ping:
            return self.name == "verl-sf" or await self._answers_ping()
        return await super().supports(kind)

    async def _answers_ping(self) -> bool:
        try:
            return await self.ping() == "pong"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False

    async def ping(self) -> str:
        """GET /v1/ping on a kept-alive connection, as run_code's calls use."""
        if self._ping_session is None:
            self._ping_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async with self._ping_session.get(self.base_url + "/v1/ping") as response:
            return await response.json()

    async def close(self) -> None:
        if self._ping_session is not None:
            await self._ping_session.close()
            self._ping_session = None
        await super().close()

    async def describe(self) -> Optional[dict]:
        """A verl-sf server's /health (isolation, fast path, slots, preloaded modules), so a
        result says what it measured; other Sandbox Fusion servers have no such endpoint."""
        if self.name != "verl-sf":
            return None
        health_url = self.inner.base_url + "/health"
        async with aiohttp.ClientSession() as session, \
                session.get(health_url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return await resp.json() if resp.status == 200 else {"health_http_status": resp.status}


class VerlSfServerBackend(BenchBackend):
    """`verl-sf serve --port 0` started for the run (and stopped after it), then driven over HTTP.

    Unlike `verl_sf.server.process` (blocking, for tests) this launcher is asyncio's: Ctrl-C or
    SIGTERM during the start still stops the server, and the server's output goes to
    `log_path` (kept draining), so the progress bar stays readable and a failed start can be
    diagnosed.  The listening line is parsed with that module's LISTEN_RE, the one definition.
    """

    name = "verl-sf"
    START_TIMEOUT_S = 180.0

    def __init__(self, server_args: list[str], log_path: Path, client_timeout: float,
                 checkout: Optional[str] = None) -> None:
        self.server_args, self.log_path, self.client_timeout = server_args, log_path, client_timeout
        self.checkout = os.path.abspath(checkout) if checkout else None
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._drain: Optional[asyncio.Task] = None
        self._http: Optional[HttpAdapter] = None

    async def start(self, max_concurrency: int) -> None:
        cmd = [sys.executable, "-m", "verl_sf.cli", "serve", "--host", "127.0.0.1", "--port", "0",
               *self.server_args]
        env = dict(os.environ)
        if self.checkout:  # that checkout's verl_sf first, as verl_sf.server.process does
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (self.checkout, env.get("PYTHONPATH"))))
        self._proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            cwd=self.checkout, env=env)
        log = self.log_path.open("w", encoding="utf-8")
        try:
            url = await asyncio.wait_for(self._read_until_listening(log), self.START_TIMEOUT_S)
        except BaseException as exc:
            log.close()
            await self._stop()
            if not isinstance(exc, (asyncio.TimeoutError, RuntimeError)):
                raise
            reason = (f"did not print 'listening on' within {self.START_TIMEOUT_S:g} s"
                      if isinstance(exc, asyncio.TimeoutError) else str(exc))
            tail = self.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"verl-sf serve {reason} (log: {self.log_path}); last output:\n{tail}") from None
        # Keep reading: a full pipe would block the server's next write.
        self._drain = asyncio.create_task(self._copy_rest(log))
        self._http = HttpAdapter(self.name, url, max_concurrency, self.client_timeout)

    async def _read_until_listening(self, log) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = (await self._proc.stdout.readline()).decode(errors="replace")
            if not line:
                raise RuntimeError(f"exited with status {await self._proc.wait()} before listening")
            log.write(line)
            log.flush()
            match = LISTEN_RE.search(line)
            if match:
                return match.group(1)

    async def _copy_rest(self, log) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with log:
            async for line in self._proc.stdout:
                log.write(line.decode(errors="replace"))

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        assert self._http is not None, "start() first"
        return await self._http.run_code(request, session=session)

    async def end_session(self, session: str) -> None:
        assert self._http is not None, "start() first"
        await self._http.end_session(session)

    async def supports(self, kind: Kind) -> bool:
        assert self._http is not None, "start() first"
        return await self._http.supports(kind)

    async def ping(self) -> str:
        assert self._http is not None, "start() first"
        return await self._http.ping()

    @property
    def base_url(self) -> Optional[str]:
        return self._http.base_url if self._http is not None else None

    @property
    def memory_root_pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    async def describe(self) -> Optional[dict]:
        return await self._http.describe() if self._http is not None else None

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except asyncio.TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        await self._stop()
        if self._drain is not None:
            await self._drain
            self._drain = None


class LocalBackend(Adapter):
    """verl-sf's executor in this process (`backend: local`): the server's work without HTTP."""

    def __init__(self) -> None:
        super().__init__("local", LocalSandboxBackend())

    async def start(self, max_concurrency: int) -> None:
        # The backend starts its executor on first use; do that now, outside the measurement.
        await self.inner.run_code(RunCodeRequest(code="pass", language="python"))

    @property
    def memory_root_pid(self) -> int:
        return os.getpid()


class DaytonaBackend(Adapter):
    """Daytona cloud sandboxes through verl-sf's daytona backend, as the guide measures them:
    one sandbox per concurrent call, all created up front (outside the measurement), reused
    round-robin, deleted at the end."""

    def __init__(self) -> None:
        super().__init__("daytona", DaytonaSandboxBackend())
        self._free: Optional[asyncio.Queue] = None

    async def start(self, max_concurrency: int) -> None:
        if not os.environ.get("DAYTONA_API_KEY"):
            raise BackendSkipped("daytona: DAYTONA_API_KEY is not set; export it to benchmark Daytona")
        sessions = [f"bench-{i}" for i in range(max_concurrency)]
        probe = RunCodeRequest(code="pass", language="python")
        await asyncio.gather(*(self.inner.run_code(probe, session=s) for s in sessions))
        self._free = asyncio.Queue()
        for session in sessions:
            self._free.put_nowait(session)

    async def supports(self, kind: Kind) -> bool:
        return kind == Kind.run  # its sandboxes are pooled over calls, as the guide measures them

    async def run_code(self, request: RunCodeRequest, *, session: Optional[str] = None) -> RunCodeResponse:
        assert self._free is not None, "start() first"
        session = await self._free.get()
        try:
            return await self.inner.run_code(request, session=session)
        finally:
            self._free.put_nowait(session)


def make_backend(name: str, *, url: Optional[str], server_args: list[str], log_dir: Path, checkout: Optional[str],
                 max_concurrency: int, client_timeout: float, docker_image: str, docker_memory: str) -> BenchBackend:
    """Build the adapter for one `--backend` value (already validated and de-aliased)."""
    if name == "verl-sf":
        if url:
            return HttpAdapter(name, url, max_concurrency, client_timeout)
        return VerlSfServerBackend(server_args, log_dir / "server.log", client_timeout, checkout)
    if name == "sandbox_fusion":
        if not url:
            raise ValueError("--backend sandbox_fusion needs the server's address: --url or --sandbox-fusion-url")
        return HttpAdapter(name, url, max_concurrency, client_timeout)
    if name == "local":
        return LocalBackend()
    if name == "subprocess":
        return SubprocessBackend()
    if name == "docker":
        return DockerBackend(docker_image, docker_memory)
    if name == "daytona":
        return DaytonaBackend()
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
