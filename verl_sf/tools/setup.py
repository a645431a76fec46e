"""Shared set-up: the trajectories of rows that carry the same set-up start from one snapshot of it.

A row's `tools_kwargs` can carry the state its trajectories start in, as verl passes it to the
tool's `create()`:

    {"code_interpreter": {"create_kwargs": {"setup": {"code": "import pandas as pd\\ndf = ...",
                                                      "files": {"data.csv": "<base64>"}}}}}

The first trajectory to need a set-up runs it in a session of its own and snapshots that session;
every trajectory (the first included) then opens its session from the snapshot, so a group of n
trajectories runs its set-up once instead of n times.  Set-ups are told apart by their content
(language, code, files), so rows of different prompts that carry the same one share it too.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from verl_sf.errors import VerlSfError
from verl_sf.models import MAX_TIMEOUT_S, RunCodeRequest, SessionLanguage, SnapshotInfo

log = logging.getLogger(__name__)


class SetupFailed(VerlSfError, RuntimeError):
    """A row's set-up could not be run or snapshotted (the message says how); reported to each trajectory."""


class SessionSetup(BaseModel):
    """`create_kwargs["setup"]`: what a trajectory's session holds before its first call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    language: SessionLanguage = "python"
    code: str = ""
    files: dict[str, Optional[str]] = Field(default_factory=dict)
    """Sandbox Fusion's `files`: path (relative to the working directory, or under /tmp, /mnt/data) -> base64."""
    timeout: Optional[float] = Field(None, gt=0, le=MAX_TIMEOUT_S)
    """Seconds the set-up may run (default: the tool's `default_timeout`)."""

    @field_validator("files")
    @classmethod
    def _paths(cls, files: dict[str, Optional[str]]) -> dict[str, Optional[str]]:
        """The checks a run's `files` get (relative, or under /tmp or /mnt/data; no '..')."""
        try:
            RunCodeRequest(code="", language="python", files=files)
        except ValidationError as exc:
            raise ValueError("; ".join(str(err["msg"]).removeprefix("Value error, ") for err in exc.errors())) from None
        return files

    @model_validator(mode="after")
    def _not_empty(self) -> SessionSetup:
        if not self.code.strip() and not self.files:
            raise ValueError("a set-up needs `code`, `files` or both")
        return self

    @classmethod
    def parse(cls, raw: Any) -> SessionSetup:
        """`raw` as a set-up; `ValueError` naming each bad key (`setup.<key>: ...`)."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"setup{''.join(f'.{part}' for part in err['loc'])}: "
                                 f"{str(err['msg']).removeprefix('Value error, ')}" for err in exc.errors())
            raise ValueError(problems) from None

    @property
    def key(self) -> str:
        """Equal for set-ups that leave a session in the same state: a hash of what is run and written."""
        content = json.dumps([self.language, self.code, sorted(self.files.items())], separators=(",", ":"))
        return hashlib.sha256(content.encode()).hexdigest()

    def request(self, default_timeout: float, memory_limit_MB: int) -> RunCodeRequest:
        timeout = self.timeout or default_timeout
        return RunCodeRequest(code=self.code, language=self.language, files=dict(self.files), run_timeout=timeout,
                              compile_timeout=timeout, memory_limit_MB=memory_limit_MB)


class SharedSetups:
    """One snapshot per set-up, built once however many trajectories ask for it at once.

    Concurrent askers of one set-up wait for the same build (a future per key); a failed build is
    raised to each of them and then forgotten, so a later trajectory tries again.  At most
    `capacity` snapshots are kept: the least recently used is deleted to make room (a trajectory
    that still needs it builds it again), and `close()` deletes the rest.
    """

    def __init__(self, build: Callable[[SessionSetup], Awaitable[SnapshotInfo]],
                 delete: Callable[[str], Awaitable[None]], capacity: int):
        self._build = build
        self._delete = delete
        self.capacity = capacity
        self._snapshots: collections.OrderedDict[str, asyncio.Future[SnapshotInfo]] = collections.OrderedDict()
        self._deleting: set[asyncio.Task] = set()

    async def snapshot(self, setup: SessionSetup) -> SnapshotInfo:
        """The set-up's snapshot; `SetupFailed` (or the backend's error) when it cannot be had."""
        future = self._snapshots.get(setup.key)
        if future is not None and future.get_loop() is not asyncio.get_running_loop():
            future = None  # made on a loop that has ended: its snapshot is left to the server's TTL
        if future is None:
            future = asyncio.ensure_future(self._build(setup))
            self._snapshots[setup.key] = future
            future.add_done_callback(lambda done: self._settled(setup.key, done))
            self._evict()
        else:
            self._snapshots.move_to_end(setup.key)
        return await asyncio.shield(future)

    def discard(self, setup: SessionSetup, snapshot_id: str) -> None:
        """Forget the set-up's snapshot `snapshot_id` (the server no longer has it): the next ask builds anew."""
        future = self._snapshots.get(setup.key)
        if future is not None and _snapshot_id(future) == snapshot_id:
            del self._snapshots[setup.key]

    async def close(self) -> None:
        """Delete every snapshot made on this loop (never raises: a leftover expires at the server's TTL)."""
        loop = asyncio.get_running_loop()
        ids = [snapshot_id for future in self._snapshots.values()
               if future.get_loop() is loop and (snapshot_id := _snapshot_id(future)) is not None]
        self._snapshots.clear()
        for snapshot_id in ids:
            self._spawn_delete(snapshot_id)
        await asyncio.gather(*self._deleting, return_exceptions=True)

    def _settled(self, key: str, future: asyncio.Future[SnapshotInfo]) -> None:
        if _snapshot_id(future) is None and self._snapshots.get(key) is future:
            del self._snapshots[key]  # a failure is told to its waiters, never kept as the set-up's answer

    def _evict(self) -> None:
        """Delete the least recently used built snapshots beyond `capacity` (builds in progress stay)."""
        excess = len(self._snapshots) - self.capacity
        for key in [key for key, future in self._snapshots.items() if future.done()][:max(0, excess)]:
            snapshot_id = _snapshot_id(self._snapshots.pop(key))
            if snapshot_id is not None:
                self._spawn_delete(snapshot_id)

    def _spawn_delete(self, snapshot_id: str) -> None:
        task = asyncio.ensure_future(self._delete_quietly(snapshot_id))
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    async def _delete_quietly(self, snapshot_id: str) -> None:
        try:
            await self._delete(snapshot_id)
        except Exception as exc:  # the server's TTL is the backstop
            log.warning("code_interpreter: could not delete set-up snapshot %s: %s", snapshot_id, exc)


def _snapshot_id(future: asyncio.Future[SnapshotInfo]) -> Optional[str]:
    """The built snapshot's id, None while building or after a failure."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result().snapshot_id
