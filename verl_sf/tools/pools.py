"""How the tool gets a permit and a place to run: the Ray pool, or an in-process limiter.

`ray`: verl's execution pool (an `ExecutionWorker` actor per tool object) behind the
cluster-wide `TokenBucketWorker`, so `rate_limit` caps executions in flight across every
rollout worker of the cluster.  `inprocess`: an asyncio semaphore, for TRL / plain asyncio
users without Ray; `rate_limit` then caps this process only.  Both are created on first
use, once per tool object, so verl's per-call create/execute/release stays cheap.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional, TypeVar

from verl_sf.backends.base import SandboxUnavailable

T = TypeVar("T")


class InProcessPool:
    """At most `limit` functions running at once in this process (FIFO waiters)."""

    kind = "inprocess"

    def __init__(self, limit: int):
        self._semaphore = asyncio.Semaphore(limit)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        async with self._semaphore:
            return await fn(*args)

    async def close(self, *closers: tuple[Callable[..., Awaitable[Any]], tuple]) -> None:
        for fn, args in closers:
            await fn(*args)


class RayPool:
    """verl_sf.pool's execution pool, created lazily; a dead actor is replaced on next use."""

    kind = "ray"

    def __init__(self, num_workers: int, rate_limit: int, enable_global_rate_limit: bool):
        self.num_workers = num_workers
        self.rate_limit = rate_limit
        self.enable_global_rate_limit = enable_global_rate_limit
        self._actor: Optional[Any] = None

    def _pool(self) -> Any:
        if self._actor is None:
            from verl_sf.pool import PoolMode, init_execution_pool

            self._actor = init_execution_pool(num_workers=self.num_workers,
                                              enable_global_rate_limit=self.enable_global_rate_limit,
                                              rate_limit=self.rate_limit, mode=PoolMode.ThreadMode)
        return self._actor

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        from ray.exceptions import RayActorError, RayTaskError

        actor = self._pool()
        try:
            return await actor.execute.remote(fn, *args)
        except RayTaskError as exc:
            # fn raised: hand back its own exception (Ray's wrapper's text is the remote traceback).
            if isinstance(exc.cause, Exception):
                raise exc.cause from None
            raise
        except RayActorError as exc:  # died or unreachable: the next call starts a fresh actor
            if self._actor is actor:
                self._actor = None
            raise SandboxUnavailable(f"execution pool actor unavailable: {exc}") from exc

    async def close(self, *closers: tuple[Callable[..., Awaitable[Any]], tuple]) -> None:
        """Run `closers` inside the actor (they hold its sandboxes), then let it go."""
        actor, self._actor = self._actor, None
        if actor is None:
            return
        import ray
        from ray.exceptions import RayActorError

        try:
            for fn, args in closers:
                await actor.execute.remote(fn, *args)
            await actor.close.remote()
        except RayActorError:
            pass  # already dead: nothing left to close in it
        finally:
            ray.kill(actor)


def make_pool(mode: str, num_workers: int, rate_limit: int, enable_global_rate_limit: bool) -> Any:
    """`auto` picks Ray when this process is connected to a Ray cluster (always true in verl)."""
    if mode == "auto":
        try:
            import ray
        except ImportError:
            mode = "inprocess"
        else:
            mode = "ray" if ray.is_initialized() else "inprocess"
    if mode == "ray":
        return RayPool(num_workers, rate_limit, enable_global_rate_limit)
    # The Ray pool's concurrency is min(actor threads, global permits); mirror it here.
    return InProcessPool(min(num_workers, rate_limit) if enable_global_rate_limit else num_workers)
