"""`SandboxFusionTool`: verl's `code_interpreter` tool, on any dispatcher (`pool` key) and backend.

verl 0.9's ToolAgentLoop calls `create -> execute(instance_id, args, agent_data=...) ->
release` around every single tool call and never calls `calc_reward`, so create and
release are dictionary operations, and the dispatcher and backend are built once per tool
object, on first use.  Callers that keep an instance across calls (`create(ground_truth=
...)`, `calc_reward`, `release`) get verl's old per-instance behaviour.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from typing import Any, Optional
from uuid import uuid4

from verl_sf.backends.base import SandboxUnavailable
from verl_sf.errors import SessionBusy, SessionGone, SnapshotGone, VerlSfError
from verl_sf.models import MAX_TIMEOUT_S, SANDBOX_FUSION_LANGUAGES, RunCodeRequest, SnapshotInfo
from verl_sf.tools import reply
from verl_sf.tools._compat import BaseTool, OpenAIFunctionToolSchema, ToolResponse, rollout_trace_op
from verl_sf.tools.backend_calls import (
    Execution,
    build_snapshot,
    check_sessions,
    close_backend,
    delete_snapshot,
    end_session,
    run_request,
)
from verl_sf.tools.code import extract_python_block, print_last_expression
from verl_sf.tools.config import ToolConfig
from verl_sf.tools.dispatch import Closer, Dispatcher, make_dispatcher
from verl_sf.tools.schema import code_interpreter_schema
from verl_sf.tools.setup import SessionSetup, SetupFailed, SharedSetups

log = logging.getLogger(__name__)


class ToolArgumentError(VerlSfError, ValueError):
    """The model's arguments cannot be run (missing code, bad timeout or language)."""


@dataclasses.dataclass
class _Instance:
    ground_truth: Any = None
    session: Optional[str] = None  # a backend session keyed on this instance (no trajectory given)
    setup: Optional[SessionSetup] = None  # the row's set-up: its session starts from a snapshot of it


class SandboxFusionTool(BaseTool):
    """Runs the model's code in a sandbox and returns what it printed.

    Config (the tool yaml's `config:`): verl's `type`, `num_workers`, `rate_limit`,
    `enable_global_rate_limit`, `default_timeout`, `default_language`, `sandbox_fusion_url`,
    `memory_limit_mb`, plus `backend` (http | local | daytona | cluster), `session` (none | trajectory:
    one live interpreter per trajectory, docs/sessions.md), the ReTool switches
    `extract_code_block` and `print_last_expression`, `max_output_chars`, `max_setup_snapshots` and `pool`.
    A row's `create_kwargs` may carry a `setup` its trajectories' sessions start from (docs/sessions.md).
    See docs/verl.md.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        self.settings = ToolConfig.parse(config)
        super().__init__(config, tool_schema or code_interpreter_schema())
        self.backend_config = self.settings.backend_config
        self.backend_name = self.backend_config.type
        self._keeps_sessions = self.settings.session_mode == "trajectory"
        # A server without sessions fails here, not on the first call; an unreachable one is asked at first create.
        self._sessions_checked = not self._keeps_sessions or self.backend_config.probe_sessions()
        self._dispatcher: Optional[Dispatcher] = None
        self._instances: dict[str, _Instance] = {}
        # Backend sessions of live trajectories: AgentData -> session, session -> its finalizer.
        self._trajectory_sessions: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._trajectories: dict[str, weakref.finalize] = {}
        self._background: set[asyncio.Task] = set()
        self.setups = SharedSetups(self._build_setup, self._delete_snapshot, self.settings.max_setup_snapshots)
        # Sessions opened from their set-up's snapshot: their later calls need no snapshot (it may be evicted).
        self._set_up: set[str] = set()

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            s = self.settings
            self._dispatcher = make_dispatcher(s.pool, s.num_workers, s.rate_limit, s.enable_global_rate_limit)
        return self._dispatcher

    # ---- lifecycle -------------------------------------------------------------------
    async def create(self, instance_id: Optional[str] = None, ground_truth: Any = None,
                     **kwargs: Any) -> tuple[str, ToolResponse]:
        """Register an instance.  verl 0.9 passes `create_kwargs={...}` (which may hold ground_truth, and the
        row's `setup`: docs/sessions.md); a set-up that is malformed, or given without `session: trajectory`,
        raises `ToolArgumentError` naming the problem."""
        create_kwargs = kwargs.get("create_kwargs") or {}
        if ground_truth is None:
            ground_truth = create_kwargs.get("ground_truth")
        setup = self._setup(create_kwargs.get("setup"))
        if not self._sessions_checked:
            await self.dispatcher.run(check_sessions, self.backend_config)
            self._sessions_checked = True
        instance_id = instance_id or uuid4().hex
        self._instances[instance_id] = _Instance(ground_truth=ground_truth, setup=setup)
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, Optional[float], dict]:
        """Run `parameters["code"]`; returns (text for the model, None reward, metrics).

        Never raises for anything the model or the sandbox did: bad arguments, errors,
        time-outs and an unreachable sandbox all come back as text the model can act on.
        """
        try:
            request = self._request(parameters)
        except ToolArgumentError as exc:
            return ToolResponse(text=f"Invalid arguments: {exc}"), None, reply.metrics(
                None, self.backend_name, truncated=False, status=reply.CallStatus.invalid_arguments)
        session = self._session(instance_id, kwargs.get("agent_data"))
        instance = self._instances.get(instance_id)
        submitted = time.time()
        try:
            execution = await self._run(request, session, instance.setup if instance else None)
        except (SetupFailed, SnapshotGone, SessionBusy) as exc:  # the trajectory could not start from its set-up
            return ToolResponse(text=reply.setup_failed_text(str(exc))), None, reply.metrics(
                None, self.backend_name, truncated=False, status=reply.CallStatus.setup_failed)
        except SessionGone as exc:
            if session is not None:
                self._set_up.discard(session)  # its next session opens from the snapshot again
            return ToolResponse(text=reply.session_ended_text(exc.reason)), None, reply.metrics(
                None, self.backend_name, truncated=False, status=reply.CallStatus.session_ended)
        except SandboxUnavailable as exc:
            log.warning("code_interpreter: sandbox unavailable: %s", exc)
            return ToolResponse(text=reply.unavailable_text(exc)), None, reply.metrics(
                None, self.backend_name, truncated=False)
        response = execution.response
        if response.session_alive is False and session is not None:
            self._set_up.discard(session)
        text, cut = reply.reply_text(response, request.run_timeout, self.settings.max_output_chars)
        metrics = reply.metrics(response, self.backend_name, truncated=cut)
        metrics["pool_wait"] = max(0.0, execution.started_at - submitted)
        metrics["queue_wait"] = metrics["pool_wait"] + (response.queue_wait or 0.0)
        return ToolResponse(text=text), None, metrics

    def ground_truth(self, instance_id: str) -> Any:
        """What `create(ground_truth=...)` stored, for subclasses that score in calc_reward."""
        instance = self._instances.get(instance_id)
        return instance.ground_truth if instance else None

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """Running code earns nothing by itself: 0.0 (verl's old tool returned an always-empty list)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance; end its own backend session if it had one (never raises:
        verl calls this in a `finally`)."""
        instance = self._instances.pop(instance_id, None)
        if instance is not None and instance.session is not None:
            await self._end_session_quietly(instance.session)

    async def close(self) -> None:
        """End every session, delete the set-ups' snapshots, close the backend and the dispatcher (not needed
        for verl, where the server's TTL ends what the rollout worker leaves; tidy for tests and the driver)."""
        if self._dispatcher is not None:
            await self.setups.close()
        for finalizer in list(self._trajectories.values()):
            finalizer.detach()
        sessions = list(self._trajectories) + [i.session for i in self._instances.values() if i.session]
        self._trajectories.clear()
        self._instances.clear()
        self._set_up.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._dispatcher is not None:
            closers: list[Closer] = [(end_session, (self.backend_config, s)) for s in sessions]
            closers.append((close_backend, (self.backend_config,)))
            dispatcher, self._dispatcher = self._dispatcher, None
            await dispatcher.close(*closers)

    # ---- helpers ---------------------------------------------------------------------
    async def _run(self, request: RunCodeRequest, session: Optional[str],
                   setup: Optional[SessionSetup]) -> Execution:
        """Run in `session`; a session in the set-up's language opens from the set-up's snapshot, and a
        snapshot the server has lost is built again, once (`SnapshotGone` if that one is lost too)."""
        if setup is None or session is None or setup.language != request.language or session in self._set_up:
            return await self.dispatcher.run(run_request, self.backend_config, request, session)
        snapshot = await self.setups.snapshot(setup)
        try:
            execution = await self.dispatcher.run(run_request, self.backend_config, request, session, snapshot)
        except SnapshotGone:
            self.setups.discard(setup, snapshot.snapshot_id)  # expired or deleted at the server
            snapshot = await self.setups.snapshot(setup)
            execution = await self.dispatcher.run(run_request, self.backend_config, request, session, snapshot)
        self._set_up.add(session)
        return execution

    async def _build_setup(self, setup: SessionSetup) -> SnapshotInfo:
        """Run a set-up once and snapshot it; any failure on the way is the set-up's, told to each trajectory."""
        request = setup.request(self.settings.default_timeout, self.settings.memory_limit_mb)
        try:
            return await self.dispatcher.run(build_snapshot, self.backend_config, request,
                                             self.settings.max_output_chars)
        except SetupFailed:
            raise
        except (VerlSfError, ValueError) as exc:  # unreachable sandbox, no fork on this server, snapshot cap
            raise SetupFailed(f"the row's set-up could not be prepared: {exc}") from exc

    async def _delete_snapshot(self, snapshot_id: str) -> None:
        await self.dispatcher.run(delete_snapshot, self.backend_config, snapshot_id)

    def _setup(self, raw: Any) -> Optional[SessionSetup]:
        if raw is None:
            return None
        if not self._keeps_sessions:
            raise ToolArgumentError("a row's `setup` needs sessions: set `session: trajectory` in the tool config")
        try:
            return SessionSetup.parse(raw)
        except ValueError as exc:
            raise ToolArgumentError(str(exc)) from None

    def _request(self, parameters: dict[str, Any]) -> RunCodeRequest:
        if not isinstance(parameters, dict):
            raise ToolArgumentError(f"expected a JSON object with a 'code' string, got {type(parameters).__name__}")
        code = parameters.get("code")
        if code is None or (isinstance(code, str) and not code.strip()):
            raise ToolArgumentError("'code' is required and must be a non-empty string")
        code = code if isinstance(code, str) else str(code)
        language = parameters.get("language") or self.settings.default_language
        if language not in SANDBOX_FUSION_LANGUAGES:
            raise ToolArgumentError(f"unknown language {language!r}")
        timeout = parameters.get("timeout", self.settings.default_timeout)
        try:
            timeout = float(timeout)
        except (TypeError, ValueError):
            raise ToolArgumentError(f"'timeout' must be a number of seconds, got {timeout!r}") from None
        if not 0 < timeout <= MAX_TIMEOUT_S:
            raise ToolArgumentError(f"'timeout' must be > 0 and <= {MAX_TIMEOUT_S:g} seconds, got {timeout:g}")
        if language == "python":
            if self.settings.extract_code_block:
                code = extract_python_block(code)
            if self.settings.print_last_expression:
                code = print_last_expression(code)
        return RunCodeRequest(code=code, language=language, run_timeout=timeout, compile_timeout=timeout,
                              memory_limit_MB=self.settings.memory_limit_mb)

    def _session(self, instance_id: str, agent_data: Any) -> Optional[str]:
        """The session a call runs in (None without `session: trajectory`): its trajectory's, else its instance's.

        A trajectory is its AgentData object, not just its request_id: under verl's
        full_determinism many trajectories share one request_id ("det-0").
        """
        if not self._keeps_sessions:
            return None
        request_id = getattr(agent_data, "request_id", None)
        if request_id:
            try:
                session = self._trajectory_sessions.get(agent_data)
                if session is None:
                    session = f"traj-{request_id}-{uuid4().hex[:8]}"
                    # verl never tells a tool that a trajectory ended; its AgentData going away does.
                    finalizer = weakref.finalize(agent_data, self._trajectory_ended, asyncio.get_running_loop(),
                                                 session)
                    self._trajectory_sessions[agent_data] = session
                    self._trajectories[session] = finalizer
                return session
            except TypeError:
                pass  # not weak-referenceable: fall back to the instance's lifetime
        instance = self._instances.setdefault(instance_id, _Instance())
        instance.session = instance.session or f"inst-{instance_id}"
        return instance.session

    def _trajectory_ended(self, loop: asyncio.AbstractEventLoop, session: str) -> None:
        """Called when the trajectory's AgentData is collected, from whatever thread did it."""
        if loop.is_closed():
            return
        loop.call_soon_threadsafe(self._spawn_end_session, session)

    def _spawn_end_session(self, session: str) -> None:
        if self._trajectories.pop(session, None) is None:
            return  # already ended by close()
        task = asyncio.ensure_future(self._end_session_quietly(session))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _end_session_quietly(self, session: str) -> None:
        self._set_up.discard(session)
        try:
            await self.dispatcher.run(end_session, self.backend_config, session)
        except Exception as exc:  # a background cleanup must not crash the loop; the reaper is the backstop
            log.warning("code_interpreter: could not end session %s: %s", session, exc)
