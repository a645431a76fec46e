"""Sandboxes started ahead of the create calls that take them, so a create need not wait for a session.

A ready sandbox is a session with the guest set up (no environment variables, a default context
never run in) and one cell run in a scratch context that is then removed: a new session's first
cell pays thousands of copy-on-write faults on IPython's pages, and those are paid here, off the
request's path.  Nothing of a tenant's is ever in one: it gets its owner, tokens and id when taken.
Kept per home alias (E2B's `/home/user`, Daytona's none); refilled after each take; dropped after
`ready_ttl_s` unused, so an idle server holds none for long.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Optional

from verl_sf.e2b.config import BoxApiConfig
from verl_sf.errors import SessionGone, VerlSfError
from verl_sf.executor import Executor

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Ready:
    session_id: str
    default_context: str
    made_at: float
    """Unix time."""


Starter = Callable[[Optional[str]], Awaitable[Ready]]


class ReadyBoxes:
    def __init__(self, executor: Executor, config: BoxApiConfig, start: Starter):
        self.executor = executor
        self.config = config
        self._start = start
        self._queues: dict[Optional[str], collections.deque[Ready]] = collections.defaultdict(collections.deque)
        self._filling: dict[Optional[str], asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def take(self, home_alias: Optional[str], timeout_s: float) -> Optional[Ready]:
        """The oldest ready sandbox for `home_alias` whose session lives `timeout_s` more (its lifetime
        counts from its start), or None; those whose session ended are dropped, those too old for
        this timeout kept for other creates; the queue is refilled behind it either way."""
        queue = self._queues[home_alias]
        lifetime_s = self.executor.config.session_max_lifetime_s
        now = time.time()
        taken = None
        for ready in list(queue):
            if ready.session_id not in self.executor.sessions:
                queue.remove(ready)
            elif now - ready.made_at + timeout_s <= lifetime_s:
                queue.remove(ready)
                taken = ready
                break
        self._fill(home_alias)
        return taken

    def expire(self, now: float) -> None:
        """End the ready sandboxes unused for `ready_ttl_s` (Unix time `now`)."""
        for queue in self._queues.values():
            while queue and now - queue[0].made_at >= self.config.ready_ttl_s:
                self._end(queue.popleft())

    def close(self) -> None:
        for task in self._filling.values():
            task.cancel()
        for queue in self._queues.values():
            while queue:
                self._end(queue.popleft())

    def _fill(self, home_alias: Optional[str]) -> None:
        if self.config.ready_sandboxes > 0 and home_alias not in self._filling:
            self._filling[home_alias] = asyncio.ensure_future(self._filled(home_alias))

    async def _filled(self, home_alias: Optional[str]) -> None:
        queue = self._queues[home_alias]
        try:
            while len(queue) < self.config.ready_sandboxes and self._room():
                queue.append(await self._start(home_alias))
        except (VerlSfError, OSError) as exc:  # the server is full or the session failed: creates start their own
            log.info("no ready sandbox started: %s", exc)
        finally:
            del self._filling[home_alias]

    def _room(self) -> bool:
        """Starting one takes a session and two calls: only while at most half the session cap and half
        the in-flight cap are in use, so that no client's request is refused for one."""
        executor, config = self.executor, self.executor.config
        return len(executor.sessions) + self.config.ready_sandboxes < config.max_sessions // 2 and \
            executor.stats.in_flight + 1 < config.max_in_flight // 2

    def _end(self, ready: Ready) -> None:
        with contextlib.suppress(SessionGone):
            self.executor.end_session(ready.session_id)
