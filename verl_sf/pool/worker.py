"""`ExecutionWorker` and `init_execution_pool`: verl's execution pool, with its defects fixed.

Same names, arguments and defaults as verl <= 0.7 (`verl/tools/sandbox_fusion_tools.py`),
but the worker is an *async* Ray actor:

* waiting for a cluster-wide permit is an awaited future, not a pool thread blocked in
  `ray.get(acquire)`, so `num_workers` threads are all available for actual work;
* `execute` returns `fn`'s result or raises `fn`'s exception (verl logged it and returned
  None, which reached the model as an empty tool message);
* the permit is returned on every exit — success, exception, cancellation — and only once
  the work has really stopped (a sync `fn` in a thread cannot be interrupted, so its permit
  is held until the thread finishes: the cap counts work that is actually running);
* `enable_global_rate_limit=False` works (verl dereferenced the missing limiter);
* `PoolMode.ProcessMode` exists (verl raised NotImplementedError).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Optional, TypeVar, Union

import ray
from pydantic import BaseModel, ConfigDict, Field

from verl_sf.errors import VerlSfError
from verl_sf.pool.client import LimiterClient
from verl_sf.pool.limiter import DEFAULT_LEASE_TTL_S, DEFAULT_LIMITER_NAME, LimiterSettings
from verl_sf.pool.process_runner import ProcessRunner, function_name

T = TypeVar("T")

# Ray's default for async actors; calls beyond it queue inside Ray, which is fine because
# our own slots (num_workers) decide what runs.
_MIN_ACTOR_CONCURRENCY = 1000


class ExecutionExited(VerlSfError, RuntimeError):
    """`fn` raised SystemExit (`sys.exit()`) or KeyboardInterrupt: its call fails with this one, and
    the pool goes on.  Ray takes either, raised by an actor's method, for the end of the actor and of
    every call in it.  `code` is SystemExit's code (None for KeyboardInterrupt)."""

    def __init__(self, message: str, code: object = None):
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt with its code where Ray delivers it
        return (type(self), (str(self), self.code))


class PoolMode(Enum):
    """verl's enum, same members and values."""

    ThreadMode = 1
    ProcessMode = 2


class ExecutionWorker:
    """Runs `fn(*args, **kwargs)` under a cluster-wide permit, `num_workers` at a time.

    `fn` may be async (awaited on this actor's event loop, in both modes) or sync (run in
    one of `num_workers` threads in ThreadMode, or one of `num_workers` child processes in
    ProcessMode).  A sync `fn` that returns an awaitable has it awaited on the loop.
    """

    def __init__(self, enable_global_rate_limit: bool = True, rate_limit: int = 10,
                 mode: PoolMode = PoolMode.ThreadMode, num_workers: int = 10, *,
                 requests_per_second: Optional[float] = None, limiter_name: str = DEFAULT_LIMITER_NAME,
                 lease_ttl_s: float = DEFAULT_LEASE_TTL_S):
        _validate_pool_args(num_workers, mode)
        self._mode = _as_mode(mode)
        self._num_workers = num_workers
        self._limiter: Optional[LimiterClient] = None
        if enable_global_rate_limit:
            self._limiter = LimiterClient(rate_limit, requests_per_second, name=limiter_name,
                                          lease_ttl_s=lease_ttl_s, keep_idle=num_workers)
        self._slots: Optional[asyncio.Semaphore] = None
        self._threads: Optional[ThreadPoolExecutor] = None
        self._processes: Optional[ProcessRunner] = None
        if self._mode is PoolMode.ThreadMode:
            self._threads = ThreadPoolExecutor(num_workers, thread_name_prefix="verl-sf-exec")
        else:
            self._processes = ProcessRunner(num_workers)
        self._counts = {"running": 0, "waiting": 0, "succeeded": 0, "failed": 0,
                        "cancelled_waiting_for_thread": 0}

    async def start(self) -> None:
        """Register with the limiter now rather than on the first call (surfaces errors early)."""
        if self._limiter is not None:
            await self._limiter.connect()

    def ping(self) -> bool:
        return True

    async def execute(self, fn: Callable[..., T], *fn_args: Any, **fn_kwargs: Any) -> T:
        """Run `fn` and return its result; its exception is raised to the caller."""
        if not callable(fn):
            raise TypeError(f"execute() needs a callable as its first argument, got {type(fn).__name__}")
        self._counts["waiting"] += 1
        waiting = True
        try:
            async with self._slot(), self._permit():
                self._counts["waiting"] -= 1
                waiting = False
                self._counts["running"] += 1
                try:
                    result = await self._run(fn, fn_args, fn_kwargs)
                except (SystemExit, KeyboardInterrupt) as exc:
                    code = exc.code if isinstance(exc, SystemExit) else None
                    raise ExecutionExited(f"{function_name(fn)} raised {exc!r}: its call failed, the pool goes on",
                                          code) from None
                finally:
                    self._counts["running"] -= 1
        except BaseException:
            if waiting:  # cancelled before it ran
                self._counts["waiting"] -= 1
            else:
                self._counts["failed"] += 1
            raise
        self._counts["succeeded"] += 1
        return result

    async def stats(self) -> dict[str, Any]:
        """This worker's counters, plus the limiter's stats when the limiter is on."""
        stats: dict[str, Any] = {"mode": self._mode.name, "num_workers": self._num_workers, "pid": os.getpid(),
                                 **self._counts}
        if self._processes is not None:
            stats["process_pids"] = self._processes.pids()
        if self._limiter is not None:
            stats["limiter"] = await self._limiter.stats()
        return stats

    async def close(self) -> None:
        """Return the lease and stop threads/processes (killing the actor also works: the
        lease then expires after `lease_ttl_s` and child processes die with the actor)."""
        if self._limiter is not None:
            await self._limiter.close()
        if self._processes is not None:
            await self._processes.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    # ---- internals ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._num_workers)
        async with self._slots:
            yield

    @contextlib.asynccontextmanager
    async def _permit(self) -> AsyncIterator[None]:
        if self._limiter is None:
            yield
        else:
            async with self._limiter.permit():
                yield

    async def _run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if _is_async(fn):
            return await fn(*args, **kwargs)
        if self._processes is not None:
            result = await self._processes.run(fn, args, kwargs)
        else:
            result = await self._in_thread(fn, args, kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _in_thread(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run a sync fn in a pool thread.  A thread cannot be interrupted, so if the call
        is cancelled we keep waiting until it really ends (the permit is held exactly as
        long as the work runs) and only then let the cancellation through."""
        work = asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            self._counts["cancelled_waiting_for_thread"] += 1
            try:
                while not work.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([work])
            finally:
                self._counts["cancelled_waiting_for_thread"] -= 1
            raise


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _as_mode(mode: Union[PoolMode, str]) -> PoolMode:
    if isinstance(mode, PoolMode):
        return mode
    return PoolMode[mode]


class _PoolSize(BaseModel):
    model_config = ConfigDict(strict=True)

    num_workers: int = Field(ge=1)


def _validate_pool_args(num_workers: Any, mode: Any) -> None:
    _PoolSize(num_workers=num_workers)
    if not isinstance(mode, PoolMode) and mode not in PoolMode.__members__:
        raise ValueError(f"mode must be a PoolMode ({', '.join(PoolMode.__members__)}), got {mode!r}")


def init_execution_pool(num_workers: int, enable_global_rate_limit: bool = True, rate_limit: int = 10,
                        mode: PoolMode = PoolMode.ThreadMode, *, requests_per_second: Optional[float] = None,
                        limiter_name: str = DEFAULT_LIMITER_NAME, lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
                        **actor_options: Any) -> ray.actor.ActorHandle:
    """Create one `ExecutionWorker` actor; call it with `await pool.execute.remote(fn, *args)`.

    `rate_limit` caps executions in flight across the Ray namespace (all pools sharing
    `limiter_name`).  A pool asking for a different `rate_limit` than the live limiter's
    reconfigures it for everyone (logged as a warning).  `actor_options` go to Ray's
    `.options()` (e.g. `num_cpus`, `scheduling_strategy`).
    """
    _validate_pool_args(num_workers, mode)
    if enable_global_rate_limit:
        LimiterSettings(rate_limit=rate_limit, requests_per_second=requests_per_second, lease_ttl_s=lease_ttl_s)
    options = {"max_concurrency": max(_MIN_ACTOR_CONCURRENCY, 4 * num_workers), **actor_options}
    pool: ray.actor.ActorHandle = ray.remote(ExecutionWorker).options(**options).remote(  # type: ignore[assignment]
        enable_global_rate_limit=enable_global_rate_limit, rate_limit=rate_limit, mode=mode,
        num_workers=num_workers, requests_per_second=requests_per_second, limiter_name=limiter_name,
        lease_ttl_s=lease_ttl_s)
    pool.start.remote()
    return pool
