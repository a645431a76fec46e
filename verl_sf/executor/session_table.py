"""The executor's live sessions, what became of ended ones, and which are due to expire.

Session ids carry the server's boot tag, so a restarted server can tell a client that the id
it holds is from before the restart rather than unknown."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import secrets
import time
from typing import Optional

from verl_sf.errors import SessionGone
from verl_sf.executor.live_table import ZygoteTable
from verl_sf.executor.zygote_process import ZygoteProcess

ENDED_SESSIONS_KEPT = 100_000  # ended sessions whose reason a late call can still be told
_SESSION_ID = re.compile(r"[0-9a-f]{6}-[0-9a-f]{16}")


@dataclasses.dataclass
class SessionRecord:
    """The server's record of a live session (its zygote holds the job itself: zygote/session.py's SessionJob)."""

    id: str
    language: str
    zygote: ZygoteProcess
    open_id: int
    memory_mb: int
    idle_ttl_s: float
    created_at: float = dataclasses.field(default_factory=time.time)
    idle_since: float = dataclasses.field(default_factory=time.time)
    calls: int = 0
    group: Optional[str] = None
    busy: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    forking: bool = False  # what holds `busy` is a fork or snapshot of it, not a call


class SessionTable(ZygoteTable[SessionRecord]):
    def __init__(self) -> None:
        super().__init__(secrets.token_hex(3), ENDED_SESSIONS_KEPT)
        self.opening = 0  # sessions being created: they count against the cap already

    def new_id(self) -> str:
        return f"{self.boot_tag}-{secrets.token_hex(8)}"

    def get(self, session_id: str) -> SessionRecord:
        session = self.live.get(session_id)
        if session is not None:
            return session
        reason = self.ended(session_id)
        if reason is None:
            if not session_id.startswith(self.boot_tag + "-") and _SESSION_ID.fullmatch(session_id):
                reason = "the server restarted since it was created: sessions do not survive a restart"
            else:
                reason = "no such session"
        raise SessionGone(session_id, reason)

    def idle(self) -> list[SessionRecord]:
        """Sessions not in a call, the longest idle first."""
        return sorted((s for s in self.live.values() if not s.busy.locked()), key=lambda s: s.idle_since)

    def expired(self, now: float, max_lifetime_s: float) -> list[tuple[SessionRecord, str]]:
        """Idle sessions past their idle TTL or the maximum lifetime, with why, the longest idle first."""
        def why(session: SessionRecord) -> Optional[str]:
            if session.busy.locked():
                return None
            if now - session.idle_since > session.idle_ttl_s:
                return f"expired: idle for {now - session.idle_since:.0f} s (idle_ttl_s={session.idle_ttl_s:g})"
            if now - session.created_at > max_lifetime_s:
                return f"expired: reached the maximum lifetime of {max_lifetime_s:g} s"
            return None
        return sorted(self.due(why), key=lambda found: found[0].idle_since)
