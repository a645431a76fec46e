"""The executor's snapshots: frozen copies of sessions, started from by forking them, kept until
deleted or past their TTL."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time

from verl_sf.errors import SnapshotGone
from verl_sf.executor.live_table import ZygoteTable
from verl_sf.executor.zygote_process import ZygoteProcess

ENDED_SNAPSHOTS_KEPT = 10_000  # deleted snapshots whose reason a late request can still be told


@dataclasses.dataclass
class Snapshot:
    id: str
    language: str
    zygote: ZygoteProcess
    open_id: int
    memory_mb: int
    idle_ttl_s: float  # what sessions started from it get
    expires_at: float
    created_at: float = dataclasses.field(default_factory=time.time)
    sessions_started: int = 0
    starting: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # starts from it, one at a time


class SnapshotTable(ZygoteTable[Snapshot]):
    def __init__(self, boot_tag: str) -> None:
        super().__init__(boot_tag, ENDED_SNAPSHOTS_KEPT)

    def new_id(self) -> str:
        return f"snap-{self.boot_tag}-{secrets.token_hex(8)}"

    def get(self, snapshot_id: str) -> Snapshot:
        snapshot = self.live.get(snapshot_id)
        if snapshot is not None:
            return snapshot
        reason = self.ended(snapshot_id)
        if reason is None:
            restarted = snapshot_id.startswith("snap-") and not snapshot_id.startswith(f"snap-{self.boot_tag}-")
            reason = "the server restarted since it was taken" if restarted else "no such snapshot"
        raise SnapshotGone(snapshot_id, reason)

    def expired(self, now: float) -> list[Snapshot]:
        """Snapshots past their TTL."""
        return [snapshot for snapshot, _ in self.due(lambda s: "expired" if now >= s.expires_at else None)]
