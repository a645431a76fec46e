"""Daytona sandboxes: a record per sandbox (owner, name, labels, state, intervals) over an E2B box.

A started sandbox is one box of `verl_sf.e2b.sandboxes` (a live python session with the guest
agent in it), whose files calls show real paths (no alias): code, commands and files all see the
session's one home under one name (`/home/user` where the sandbox has it, docs/daytona.md).
Stopping a sandbox ends its box (its processes, memory and files); starting it again gives it a
fresh one.  The reaper stops sandboxes idle past their auto-stop interval and deletes stopped ones
past their auto-delete interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import time
import uuid
from collections.abc import Iterator
from typing import Optional

from verl_sf.daytona.config import DaytonaConfig
from verl_sf.e2b.config import E2BConfig
from verl_sf.e2b.sandboxes import Sandbox as Box
from verl_sf.e2b.sandboxes import Sandboxes as Boxes
from verl_sf.e2b.sandboxes import SandboxGone
from verl_sf.errors import CapacityError, ConflictError, NotFoundError
from verl_sf.executor import Closed, Closing, Executor, closed_now
from verl_sf.executor.zygote.messages import TRUNCATION_MARKER
from verl_sf.tenancy import Owner, owns

LANGUAGE_LABEL = "code-toolbox-language"  # the SDK's CODE_TOOLBOX_LANGUAGE_LABEL


class State(str, enum.Enum):
    started = "started"
    stopped = "stopped"


class NotFound(NotFoundError):
    def __init__(self, id_or_name: str):
        super().__init__(f"Sandbox with ID or name {id_or_name} not found")


class NotStarted(ConflictError):
    """A toolbox call to a sandbox that is not started (stopped by its owner, the reaper, or its box ended)."""


class NameTaken(ConflictError):
    pass


class TooManySandboxes(CapacityError):
    pass


@dataclasses.dataclass
class Output:
    """A stream of a command's, kept up to `limit` bytes (the server's output limit, as `/run_code`
    keeps a run's: a command writing 150 MiB held the event loop 0.56 s and the memory), then counted."""

    limit: int
    kept: bytearray = dataclasses.field(default_factory=bytearray)
    dropped: int = 0

    def add(self, data: bytes) -> None:
        room = max(0, self.limit - len(self.kept))
        self.kept += data[:room]
        self.dropped += max(0, len(data) - room)

    def text(self) -> str:
        marker = TRUNCATION_MARKER.format(dropped=self.dropped) if self.dropped else ""
        return self.kept.decode(errors="replace") + marker


@dataclasses.dataclass
class Command:
    id: str
    command: str
    stdout: Output
    stderr: Output
    exit_code: Optional[int] = None
    pid: Optional[int] = None  # its process group in the box, once started
    task: Optional[asyncio.Task[None]] = None


@dataclasses.dataclass
class Shell:
    """A process session of the toolbox: its commands, in order, and where the shell's state (its
    working directory and exported variables) is kept between them, inside the sandbox."""

    id: str
    commands: dict[str, Command] = dataclasses.field(default_factory=dict)
    state_dir: str = dataclasses.field(default_factory=lambda: f"/tmp/.verl-sf-shell-{uuid.uuid4().hex}")


@dataclasses.dataclass
class Spec:
    """What a creation asked for, kept and reported as Daytona reports it."""

    name: str
    labels: dict[str, str]
    env: dict[str, str]
    snapshot: Optional[str]
    user: str
    public: bool
    cpu: int
    gpu: int
    memory: int
    disk: int
    auto_stop_min: int
    auto_delete_min: int


@dataclasses.dataclass
class DaytonaSandbox:
    id: str
    owner: Owner
    spec: Spec
    created_at: float
    updated_at: float
    last_activity: float
    state: State = State.started
    box: Optional[Box] = None
    stopped_at: Optional[float] = None
    stop_reason: str = ""
    shells: dict[str, Shell] = dataclasses.field(default_factory=dict)
    busy: int = 0  # toolbox calls in progress: a sandbox in use is not idle

    def touch(self) -> None:
        self.last_activity = time.time()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        self.busy += 1
        self.touch()
        try:
            yield
        finally:
            self.busy -= 1
            self.touch()


class DaytonaSandboxes:
    def __init__(self, executor: Executor, config: DaytonaConfig):
        self.config = config
        self.boxes = Boxes(executor, E2BConfig(max_sandboxes=config.max_sandboxes,
                                               reap_interval_s=config.reap_interval_s,
                                               ready_sandboxes=config.ready_sandboxes))
        self.all: dict[str, DaytonaSandbox] = {}
        self._names: dict[Owner, set[str]] = {}  # each owner's sandbox names, taken ones included
        self._opening = 0  # boxes being started
        self._reaper: Optional[asyncio.Task[None]] = None

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.boxes.start()
        self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for sandbox in list(self.all.values()):
            self.delete(sandbox)
        await self.boxes.close()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            self.reap(time.time())

    def reap(self, now: float) -> None:
        for sandbox in list(self.all.values()):
            spec = sandbox.spec
            self.refresh(sandbox)
            minute = self.config.minute_s
            if sandbox.state is State.started and spec.auto_stop_min > 0 and not sandbox.busy \
                    and now - sandbox.last_activity >= spec.auto_stop_min * minute:
                self.stop(sandbox, f"it was idle for its auto-stop interval of {spec.auto_stop_min} min")
            if sandbox.state is State.stopped and spec.auto_delete_min >= 0 and sandbox.stopped_at is not None \
                    and now - sandbox.stopped_at >= spec.auto_delete_min * minute:
                self.delete(sandbox)

    # ---- the control plane -------------------------------------------------------------------
    async def create(self, owner: Owner, spec: Spec) -> DaytonaSandbox:
        """A started sandbox (unnamed: named by its id); nothing is recorded unless its box started."""
        sandbox_id = f"{self.config.id_prefix}{uuid.uuid4()}"
        spec.name = spec.name or sandbox_id
        if spec.name in self._names.get(owner, set()):
            raise NameTaken(f"Sandbox with name {spec.name} already exists")
        now = time.time()
        sandbox = DaytonaSandbox(id=sandbox_id, owner=owner, spec=spec, created_at=now, updated_at=now,
                                 last_activity=now)
        self._names.setdefault(owner, set()).add(spec.name)  # held while the box starts: no twin by that name
        try:
            sandbox.box = await self._new_box(spec)
        except BaseException:
            self._names[owner].discard(spec.name)
            raise
        self.all[sandbox.id] = sandbox
        return sandbox

    async def _new_box(self, spec: Spec) -> Box:
        """A box, counted against the cap from the moment it is asked for (concurrent creations included)."""
        started = sum(1 for s in self.all.values() if s.state is State.started) + self._opening
        if started >= self.config.max_sandboxes:
            raise TooManySandboxes(f"{started} sandboxes are started, the server's cap (--daytona-max-sandboxes); "
                                   f"stop or delete some")
        self._opening += 1
        try:
            return await self.boxes.create("daytona", int(self.boxes.max_timeout_s), {}, spec.env, home_alias=None)
        finally:
            self._opening -= 1

    def find(self, id_or_name: str, api_key: str) -> DaytonaSandbox:
        """The caller's sandbox by id or name; another key's is NotFound, as a missing one."""
        sandbox = self.all.get(id_or_name)
        if sandbox is not None and owns(sandbox.owner, api_key):
            return sandbox
        for candidate in self.all.values():
            if candidate.spec.name == id_or_name and owns(candidate.owner, api_key):
                return candidate
        raise NotFound(id_or_name)

    def owned(self, api_key: str) -> list[DaytonaSandbox]:
        return sorted((s for s in self.all.values() if owns(s.owner, api_key)), key=lambda s: s.created_at)

    def stop(self, sandbox: DaytonaSandbox, reason: str = "it was stopped") -> Closing[Closed]:
        """Stop a sandbox now; the future is done once every process of its box is killed."""
        box, sandbox.box = sandbox.box, None
        ended = closed_now()
        if box is not None:
            with contextlib.suppress(SandboxGone):
                ended = self.boxes.kill(box.id, f"its Daytona sandbox stopped: {reason}")
        for shell in sandbox.shells.values():
            for command in shell.commands.values():
                if command.task is not None:
                    command.task.cancel()
        sandbox.shells.clear()
        if sandbox.state is State.started:
            sandbox.stopped_at = time.time()
        sandbox.state = State.stopped
        sandbox.stop_reason = reason
        sandbox.updated_at = time.time()
        return ended

    async def start_again(self, sandbox: DaytonaSandbox) -> None:
        if sandbox.state is State.started and self._box_gone(sandbox) is None:
            return
        self.stop(sandbox, "its box ended")
        sandbox.box = await self._new_box(sandbox.spec)
        sandbox.state, sandbox.stopped_at, sandbox.stop_reason = State.started, None, ""
        sandbox.updated_at = time.time()
        sandbox.touch()

    def delete(self, sandbox: DaytonaSandbox) -> Closing[Closed]:
        ended = self.stop(sandbox, "it was deleted")
        if self.all.pop(sandbox.id, None) is not None:
            self._names[sandbox.owner].discard(sandbox.spec.name)
        return ended

    def refresh(self, sandbox: DaytonaSandbox) -> None:
        """A started sandbox whose box has ended (evicted, past the server's lifetime) is stopped, saying why."""
        if sandbox.state is State.started:
            gone = self._box_gone(sandbox)
            if gone is not None:
                self.stop(sandbox, gone)

    # ---- the toolbox -------------------------------------------------------------------------
    def box_of(self, sandbox: DaytonaSandbox) -> Box:
        """The started sandbox's box; NotStarted (saying why) when it has none."""
        self.refresh(sandbox)
        if sandbox.state is not State.started or sandbox.box is None:
            raise NotStarted(f"Sandbox {sandbox.id} is not started (state: {sandbox.state.value}; "
                             f"{sandbox.stop_reason}): start it first")
        return sandbox.box

    def _box_gone(self, sandbox: DaytonaSandbox) -> Optional[str]:
        """Why its box has ended (its session was evicted, reached the server's lifetime, ...); None if live."""
        if sandbox.box is None:
            return "it has no box"
        try:
            self.boxes.get(sandbox.box.id)
        except SandboxGone as exc:
            return exc.reason
        return None
