"""The executor's snapshots: frozen copies of sessions, started from by forking them, kept until
deleted or past their TTL."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import time
from typing import Optional

from verl_sf.errors import SnapshotGone
from verl_sf.executor.zygote_process import ZygoteProcess

ENDED_SNAPSHOTS_KEPT = 10_000  # deleted snapshots whose reason a late request can still be told


@dataclasses.dataclass
class Snapshot:
    id: str
    language: str
    source_session_id: str
    zygote: ZygoteProcess
    open_id: int
    memory_mb: int
    idle_ttl_s: float  # what sessions started from it get
    expires_at: float
    created_at: float = dataclasses.field(default_factory=time.time)
    sessions_started: int = 0
    starting: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # starts from it, one at a time


class SnapshotTable:
    def __init__(self, boot_tag: str) -> None:
        self.boot_tag = boot_tag
        self.live: dict[str, Snapshot] = {}
        self._by_open_id: dict[int, Snapshot] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self.live)

    def new_id(self) -> str:
        return f"snap-{self.boot_tag}-{secrets.token_hex(8)}"

    def add(self, snapshot: Snapshot) -> None:
        self.live[snapshot.id] = snapshot
        self._by_open_id[snapshot.open_id] = snapshot

    def get(self, snapshot_id: str) -> Snapshot:
        snapshot = self.live.get(snapshot_id)
        if snapshot is not None:
            return snapshot
        reason = self._ended.get(snapshot_id)
        if reason is None:
            restarted = snapshot_id.startswith("snap-") and not snapshot_id.startswith(f"snap-{self.boot_tag}-")
            reason = "the server restarted since it was taken" if restarted else "no such snapshot"
        raise SnapshotGone(snapshot_id, reason)

    def by_open_id(self, open_id: int) -> Optional[Snapshot]:
        return self._by_open_id.get(open_id)

    def forget(self, snapshot: Snapshot, reason: str) -> bool:
        if self.live.pop(snapshot.id, None) is None:
            return False
        self._by_open_id.pop(snapshot.open_id, None)
        self._ended[snapshot.id] = reason
        while len(self._ended) > ENDED_SNAPSHOTS_KEPT:
            self._ended.popitem(last=False)
        return True

    def expired(self, now: float) -> list[Snapshot]:
        return [snapshot for snapshot in self.live.values() if now >= snapshot.expires_at]
