"""How the tool gets a permit and a place to run: a `Dispatcher`, chosen by the tool's `pool` key.

`ray` (the default under Ray): the call runs on the tool's own event loop under a permit
from the cluster-wide `TokenBucketWorker`, so `rate_limit` caps executions in flight across
every rollout worker of the cluster.  verl's execution-pool actor existed to take blocking
`requests` calls off the rollout worker; our backends are async, so a call is one awaited
HTTP request either way and the actor hop (Ray's per-call CPU, docs/pool.md) buys nothing.
`ray_actor`: verl's execution pool (an `ExecutionWorker` actor per tool object) behind the
same limiter, for running the backend in a process of its own.  `inprocess`: an asyncio
semaphore, for TRL / plain asyncio users without Ray; `rate_limit` then caps this process
only.  Pools are created on first use, once per tool object, so verl's per-call
create/execute/release stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Optional, Protocol, TypeVar

from verl_sf.backends.base import SandboxUnavailable

if TYPE_CHECKING:
    from verl_sf.pool import LimiterClient

T = TypeVar("T")
Closer = tuple[Callable[..., Awaitable[Any]], tuple]


class Dispatcher(Protocol):
    """Where and under which limit the tool's calls run; `make_dispatcher` picks one by the tool's `pool` key."""

    kind: str
    """The `pool` value it implements: inprocess, ray or ray_actor."""

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)` under the dispatcher's limit, in the process that holds the backends."""

    async def close(self, *closers: Closer) -> None:
        """Run `closers` where the backends live, then release every permit and process."""


class InProcessDispatcher:
    """Runs async functions on the caller's event loop, at most `limit` at once.

    Semaphores and limiter clients belong to the loop they were first used on, and one tool
    object may see several loops in turn (each test, `asyncio.run` per script), so each
    loop gets its own; those of closed loops are dropped when a new loop shows up.
    """

    kind = "inprocess"

    def __init__(self, limit: int):
        self.limit = limit
        self._loops: dict[asyncio.AbstractEventLoop, tuple[asyncio.Semaphore, Optional[LimiterClient]]] = {}

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        slots, limiter = self._for_this_loop()
        async with slots, self._permit(limiter):
            return await fn(*args)

    async def close(self, *closers: Closer) -> None:
        """Run `closers` here (the backends live in this process), then return any lease."""
        for fn, args in closers:
            await fn(*args)
        loops, self._loops = self._loops, {}
        current = asyncio.get_running_loop()
        for loop, (_, limiter) in loops.items():
            if limiter is None:
                continue
            if loop is current:
                await limiter.close()
            else:  # its loop cannot run the client's tasks from here: hand the lease back at once
                limiter.abandon()

    def _new_limiter(self) -> Optional[LimiterClient]:
        """No cluster-wide permits: the semaphore is the whole limit."""
        return None

    @contextlib.asynccontextmanager
    async def _permit(self, limiter: Optional[LimiterClient]) -> AsyncIterator[None]:
        yield

    def _for_this_loop(self) -> tuple[asyncio.Semaphore, Optional[LimiterClient]]:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            for closed in [other for other in self._loops if other.is_closed()]:
                _, limiter = self._loops.pop(closed)
                if limiter is not None:
                    limiter.abandon()
            state = self._loops[loop] = (asyncio.Semaphore(self.limit), self._new_limiter())
        return state


class RayLimiterDispatcher(InProcessDispatcher):
    """`fn` runs on the caller's loop under a cluster-wide permit, `num_workers` at a time.

    Same concurrency as an `ExecutionWorker` with `num_workers` slots: a call takes a slot,
    then a permit (so at most `num_workers` requests per loop queue at the limiter), and
    returns the permit on every exit — result, exception or cancellation.
    """

    kind = "ray"

    def __init__(self, num_workers: int, rate_limit: int, *, limiter_name: Optional[str] = None):
        from verl_sf.pool import DEFAULT_LIMITER_NAME

        super().__init__(num_workers)
        self.rate_limit = rate_limit
        self.limiter_name = limiter_name or DEFAULT_LIMITER_NAME

    def _new_limiter(self) -> LimiterClient:
        from verl_sf.pool import LimiterClient

        # Keeps up to num_workers released permits while nobody waits, as the pool actor does.
        return LimiterClient(self.rate_limit, name=self.limiter_name, keep_idle=self.limit)

    @contextlib.asynccontextmanager
    async def _permit(self, limiter: Optional[LimiterClient]) -> AsyncIterator[None]:
        from ray.exceptions import ActorUnavailableError, RayActorError

        assert limiter is not None
        try:
            permit = await limiter.acquire()
        except (RayActorError, ActorUnavailableError) as exc:  # the client already retried
            raise SandboxUnavailable(f"cluster-wide limiter unavailable: {exc}") from exc
        try:
            yield
        finally:
            limiter.release(permit)


class RayActorDispatcher:
    """verl_sf.pool's execution pool actor, created lazily; a dead actor is replaced on next use."""

    kind = "ray_actor"

    def __init__(self, num_workers: int, rate_limit: int, enable_global_rate_limit: bool):
        self.num_workers = num_workers
        self.rate_limit = rate_limit
        self.enable_global_rate_limit = enable_global_rate_limit
        self._actor: Optional[Any] = None

    def _execution_pool(self) -> Any:
        if self._actor is None:
            from verl_sf.pool import PoolMode, init_execution_pool

            self._actor = init_execution_pool(num_workers=self.num_workers,
                                              enable_global_rate_limit=self.enable_global_rate_limit,
                                              rate_limit=self.rate_limit, mode=PoolMode.ThreadMode)
        return self._actor

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        from ray.exceptions import RayActorError, RayTaskError

        actor = self._execution_pool()
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

    async def close(self, *closers: Closer) -> None:
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


def make_dispatcher(mode: str, num_workers: int, rate_limit: int, enable_global_rate_limit: bool) -> Dispatcher:
    """`auto` picks `ray` when this process is connected to a Ray cluster (always true in verl)."""
    if mode == "auto":
        try:
            import ray
        except ImportError:
            mode = "inprocess"
        else:
            mode = "ray" if ray.is_initialized() else "inprocess"
    if mode == "ray_actor":
        return RayActorDispatcher(num_workers, rate_limit, enable_global_rate_limit)
    if not enable_global_rate_limit:
        return InProcessDispatcher(num_workers)  # num_workers is the only limit; no limiter is contacted
    if mode == "ray":
        return RayLimiterDispatcher(num_workers, rate_limit)
    # inprocess: the pool actor's concurrency is min(num_workers, permits); mirror it in this process.
    return InProcessDispatcher(min(num_workers, rate_limit))
