"""The systems the benchmark can drive, each behind verl-sf's own `SandboxBackend` interface.

Every adapter turns its system's answer into a Sandbox Fusion `RunCodeResponse`, so one rule
(`scenarios.classify`) judges all of them alike.  Adapters whose system is absent here (no
Docker engine, no Daytona key) raise `BackendSkipped` from `start()` with the reason, and the
benchmark moves on to the next backend.
"""

from __future__ import annotations

import asyncio
import math
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

from verl_sf.backends.base import SandboxBackend, SandboxUnavailable
from verl_sf.models import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    summarize_status,
)

BACKENDS = ("verl-sf", "local", "subprocess", "sandbox_fusion", "daytona", "docker")
ALIASES = {"sandboxfusion": "sandbox_fusion", "verl_sf": "verl-sf"}  # the guide spells it sandboxfusion


class BackendSkipped(RuntimeError):
    """This backend cannot run on this machine; the message says why and what would fix it."""


class BenchBackend(SandboxBackend):
    """A `SandboxBackend` the benchmark can also start, and whose memory it can watch."""

    async def start(self, max_concurrency: int) -> None:
        """Acquire what `run_code` needs (sessions, servers, sandboxes) for this many calls at once."""

    @property
    def memory_root_pid(self) -> Optional[int]:
        """The process whose tree holds the sandboxes, or None when they live elsewhere."""
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
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished in the meantime
            pass
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

    def __init__(self) -> None:
        self._workdir: Optional[tempfile.TemporaryDirectory] = None

    async def start(self, max_concurrency: int) -> None:
        # Runs write where they stand; keep that out of the user's checkout.
        self._workdir = tempfile.TemporaryDirectory(prefix="verl-sf-bench-")

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
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
            raise BackendSkipped("docker: `docker info` did not answer within 30 s; is the engine running?")
        if proc.returncode != 0:
            reason = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise BackendSkipped(f"docker: no Docker engine answers (`docker info` failed: {reason[0]})")

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        name = f"verl-sf-bench-{uuid.uuid4().hex[:12]}"
        argv = ["docker", "run", "--rm", "--name", name, "--network=none", f"--memory={self.memory}",
                "--cpus=1", self.image, "python3", "-c", request.code]
        # Killing the client does not stop the container; remove it by name.
        return await _run_process(argv, request.run_timeout, on_timeout=["docker", "rm", "-f", name])


class HttpBackend(BenchBackend):
    """Any server speaking the Sandbox Fusion API: POST {url}/run_code over one shared session."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.base_url = url.rstrip("/").removesuffix("/run_code")
        self._session: Optional[aiohttp.ClientSession] = None

    async def start(self, max_concurrency: int) -> None:
        # One connection per concurrent call: a smaller pool would queue calls in the client
        # and the benchmark would measure aiohttp instead of the server.
        connector = aiohttp.TCPConnector(limit=max_concurrency, limit_per_host=max_concurrency)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert self._session is not None, "start() first"
        try:
            async with self._session.post(self.base_url + "/run_code",
                                          json=request.model_dump(mode="json", exclude_none=True)) as resp:
                body = await resp.read()
        except aiohttp.ClientError as exc:
            raise SandboxUnavailable(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        if resp.status != 200:
            raise SandboxUnavailable(f"{self.name}: HTTP {resp.status}: {body[:300].decode(errors='replace')}")
        return RunCodeResponse.model_validate_json(body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class VerlSfServerBackend(HttpBackend):
    """`verl-sf serve --port 0` started for the run (and stopped after it), then driven over HTTP.

    The server's output goes to `log_path`, so the progress bar stays readable and a failed
    start can be diagnosed.
    """

    START_TIMEOUT_S = 180.0

    def __init__(self, server_args: list[str], log_path: Path) -> None:
        super().__init__("verl-sf", "http://127.0.0.1:0")
        self.server_args, self.log_path = server_args, log_path
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._drain: Optional[asyncio.Task] = None

    async def start(self, max_concurrency: int) -> None:
        cmd = [sys.executable, "-m", "verl_sf.cli", "serve", "--host", "127.0.0.1", "--port", "0",
               *self.server_args]
        self._proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        log = self.log_path.open("w", encoding="utf-8")
        try:
            self.base_url = await asyncio.wait_for(self._read_until_listening(log), self.START_TIMEOUT_S)
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
        await super().start(max_concurrency)

    async def _read_until_listening(self, log) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = (await self._proc.stdout.readline()).decode(errors="replace")
            if not line:
                raise RuntimeError(f"exited with status {await self._proc.wait()} before listening")
            log.write(line)
            log.flush()
            marker = line.find("listening on http://")
            if marker >= 0:
                return line[marker + len("listening on "):].split()[0].rstrip("/")

    async def _copy_rest(self, log) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with log:
            async for line in self._proc.stdout:
                log.write(line.decode(errors="replace"))

    @property
    def memory_root_pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

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
        await super().close()
        await self._stop()
        if self._drain is not None:
            await self._drain
            self._drain = None


class LocalBackend(BenchBackend):
    """verl-sf's executor in this process: the server's work without HTTP."""

    name = "local"

    def __init__(self) -> None:
        self._executor = None

    async def start(self, max_concurrency: int) -> None:
        from verl_sf.executor import Executor, ExecutorConfig

        self._executor = Executor(ExecutorConfig())
        await self._executor.start()

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert self._executor is not None, "start() first"
        return await self._executor.run_code(request)

    @property
    def memory_root_pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        if self._executor is not None:
            await self._executor.close()
            self._executor = None


class DaytonaBackend(BenchBackend):
    """Daytona cloud sandboxes via the `daytona` SDK, one sandbox per concurrent call (as the guide).

    Sandboxes are created for the highest concurrency up front and deleted at the end, so
    creation time is not part of the measured calls.
    """

    name = "daytona"

    def __init__(self) -> None:
        self._client = None
        self._sandboxes: list = []
        self._free: Optional[asyncio.Queue] = None

    async def start(self, max_concurrency: int) -> None:
        if not (os.environ.get("DAYTONA_API_KEY") or os.environ.get("DAYTONA_JWT_TOKEN")):
            raise BackendSkipped("daytona: DAYTONA_API_KEY is not set; export it to benchmark Daytona")
        from daytona import AsyncDaytona

        self._client = AsyncDaytona()
        results = await asyncio.gather(*(self._client.create() for _ in range(max_concurrency)),
                                       return_exceptions=True)
        self._sandboxes = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise RuntimeError(f"daytona: {len(errors)} of {max_concurrency} sandboxes failed to start: {errors[0]}")
        self._free = asyncio.Queue()
        for sandbox in self._sandboxes:
            self._free.put_nowait(sandbox)

    async def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        assert self._free is not None, "start() first"
        sandbox = await self._free.get()
        started = time.perf_counter()
        try:
            # The SDK's own limit stops the run in the sandbox; wait_for bounds the round trip.
            result = await asyncio.wait_for(
                sandbox.process.code_run(request.code, timeout=math.ceil(request.run_timeout)),
                request.run_timeout + 30)
        except asyncio.TimeoutError:
            run = CommandRunResult(status=CommandRunStatus.TimeLimitExceeded,
                                   execution_time=time.perf_counter() - started)
            return RunCodeResponse(status=summarize_status(None, run), run_result=run)
        except Exception as exc:  # the SDK's own error types vary between versions
            raise SandboxUnavailable(f"daytona: {type(exc).__name__}: {exc}") from exc
        finally:
            self._free.put_nowait(sandbox)
        # code_run merges the streams into `result`; a traceback lands there too.
        output = result.result or ""
        run = CommandRunResult(status=CommandRunStatus.Finished, execution_time=time.perf_counter() - started,
                               return_code=result.exit_code, stdout=output,
                               stderr=output if result.exit_code else "")
        return RunCodeResponse(status=summarize_status(None, run), run_result=run)

    async def close(self) -> None:
        sandboxes, self._sandboxes = self._sandboxes, []
        if self._client is not None:
            await asyncio.gather(*(self._client.delete(s) for s in sandboxes), return_exceptions=True)
            await self._client.close()
            self._client = None


def make_backend(name: str, *, url: Optional[str], server_args: list[str], log_dir: Path,
                 docker_image: str, docker_memory: str) -> BenchBackend:
    """Build the adapter for one `--backend` value (already validated and de-aliased)."""
    if name == "verl-sf":
        return HttpBackend(name, url) if url else VerlSfServerBackend(server_args, log_dir / "server.log")
    if name == "sandbox_fusion":
        if not url:
            raise ValueError("--backend sandbox_fusion needs the server's address: --url or --sandbox-fusion-url")
        return HttpBackend(name, url)
    if name == "local":
        return LocalBackend()
    if name == "subprocess":
        return SubprocessBackend()
    if name == "docker":
        return DockerBackend(docker_image, docker_memory)
    if name == "daytona":
        return DaytonaBackend()
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
