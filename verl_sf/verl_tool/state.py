"""What a trajectory keeps between its turns, in the two ways `--verl-tool-state` offers.

`SessionTrajectories` gives each trajectory a live interpreter (a server session); a turn runs
only its own code.  `ReplayTrajectories` keeps each trajectory's earlier code and re-runs it,
silenced, before the turn's own (verl-tool's semantics) through plain stateless runs.  Both
forget a trajectory on its finish signal or after `idle_ttl_s` without a turn, and run the turns
of one trajectory one at a time, in the order they arrived.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import time
from typing import Optional

from verl_sf.errors import SessionGone
from verl_sf.executor import Executor
from verl_sf.executor.live_table import LiveTable
from verl_sf.models import RunCodeRequest, RunCodeResponse, RunStatus
from verl_sf.verl_tool.config import VerlToolConfig
from verl_sf.verl_tool.programs import build_program
from verl_sf.verl_tool.protocol import TrajectoryKey
from verl_sf.verl_tool.sessions import ExecutorSessions, SessionCall


@dataclasses.dataclass
class Trajectory:
    """What the server keeps of one trajectory between its turns."""

    key: TrajectoryKey
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    last_used: float = dataclasses.field(default_factory=time.monotonic)
    earlier_code: list[str] = dataclasses.field(default_factory=list)
    """Replay mode: the code of every turn that ran, in order."""
    session_id: Optional[str] = None
    """Session mode: the trajectory's live interpreter, once its first turn opened one."""


@dataclasses.dataclass
class Turn:
    response: RunCodeResponse
    lost_state: Optional[str] = None
    """Why the trajectory's earlier state was gone when this turn ran (it ran from a clean start)."""
    state_ended: Optional[str] = None
    """Why this turn ended the trajectory's state (its interpreter died): the next turn starts clean."""


class Trajectories(abc.ABC):
    """The live trajectories by key (namespace, id), least recently used first, and the keys that expired
    lately (-> when), remembered for one more TTL to explain a late turn."""

    def __init__(self, executor: Executor, config: VerlToolConfig):
        self.executor = executor
        self.config = config
        self._table: LiveTable[TrajectoryKey, Trajectory, float] = LiveTable(lambda t: t.key, None)

    async def run_turn(self, key: TrajectoryKey, code: str, stdin: Optional[str]) -> Turn:
        while True:
            trajectory, lost_state = self._get(key)
            async with trajectory.lock:
                if self._table.live.get(key) is not trajectory:
                    continue  # it finished while this turn waited: the turn starts a new one
                try:
                    return await self._run(trajectory, code, stdin, lost_state)
                finally:
                    trajectory.last_used = time.monotonic()

    async def end(self, key: TrajectoryKey) -> None:
        """The finish signal: the trajectory's state goes (after a turn of it that is running)."""
        self._table.drop_ended(key)  # a later turn with this id starts a new trajectory
        trajectory = self._table.live.get(key)
        if trajectory is None:
            return
        async with trajectory.lock:
            if self._table.live.get(key) is trajectory:
                self._table.remove(trajectory)
                self._release(trajectory)

    def _get(self, key: TrajectoryKey) -> tuple[Trajectory, Optional[str]]:
        self._expire(time.monotonic())
        trajectory = self._table.live.get(key)
        if trajectory is not None:
            self._table.touch(trajectory)
            return trajectory, None
        trajectory = Trajectory(key)
        self._table.add(trajectory)
        if self._table.drop_ended(key) is None:
            return trajectory, None
        return trajectory, f"it had been idle for more than {self.config.idle_ttl_s:g} s"

    def _expire(self, now: float) -> None:
        ttl = self.config.idle_ttl_s
        idle = self._table.due(lambda t: None if t.lock.locked() else "idle",  # a turn running now keeps it
                               stop=lambda t: now - t.last_used <= ttl)  # least recently used first
        for trajectory, _ in idle:
            self._table.forget(trajectory, now)
            self._release(trajectory)
        self._table.drop_ended_while(lambda expired_at: now - expired_at > ttl)

    def _request(self, code: str, stdin: Optional[str]) -> RunCodeRequest:
        return RunCodeRequest(code=code, language="python", run_timeout=self.config.run_timeout, stdin=stdin)

    @abc.abstractmethod
    async def _run(self, trajectory: Trajectory, code: str, stdin: Optional[str], lost_state: Optional[str]) -> Turn:
        """Run one turn of `trajectory` (its lock held)."""

    @abc.abstractmethod
    def _release(self, trajectory: Trajectory) -> None:
        """Free what the trajectory holds beyond this process's memory (no turn of it running)."""


class ReplayTrajectories(Trajectories):
    async def _run(self, trajectory: Trajectory, code: str, stdin: Optional[str], lost_state: Optional[str]) -> Turn:
        program = build_program(code, pre_import=self.config.pre_import, earlier=trajectory.earlier_code)
        response = await self.executor.run_code(self._request(program, stdin))
        if response.status != RunStatus.SandboxError:  # code that never ran is not replayed either
            trajectory.earlier_code.append(code)
        return Turn(response, lost_state)

    def _release(self, trajectory: Trajectory) -> None:
        """Its earlier code lives in this process only."""


class SessionTrajectories(Trajectories):
    def __init__(self, executor: Executor, config: VerlToolConfig, sessions: ExecutorSessions):
        super().__init__(executor, config)
        self.sessions = sessions

    async def _run(self, trajectory: Trajectory, code: str, stdin: Optional[str], lost_state: Optional[str]) -> Turn:
        request = self._request(code, stdin)
        if trajectory.session_id is not None:
            try:
                return self._ran(trajectory, await self.sessions.run(trajectory.session_id, request), lost_state)
            except SessionGone as exc:  # it ended between turns (expired, evicted, the server restarted)
                lost_state = exc.reason
        trajectory.session_id = await self.sessions.open()
        return self._ran(trajectory, await self.sessions.run(trajectory.session_id, request), lost_state)

    @staticmethod
    def _ran(trajectory: Trajectory, call: SessionCall, lost_state: Optional[str]) -> Turn:
        if call.ended is not None:
            trajectory.session_id = None  # the next turn opens a new session
        return Turn(call.response, lost_state, call.ended)

    def _release(self, trajectory: Trajectory) -> None:
        if trajectory.session_id is not None:
            self.sessions.close(trajectory.session_id)
