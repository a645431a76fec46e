"""One process's connection to the cluster-wide limiter.

`LimiterClient` turns the limiter's batched lease protocol into `await acquire()` /
`release()` for many coroutines of one event loop:

* requests and releases made while a round trip is in flight ride together in the next
  one (group commit), so throughput grows with load instead of with the number of calls;
* one long-poll per process delivers grants and doubles as the lease heartbeat;
* waiting for a permit is a pending future — no thread is pinned while waiting;
* while nobody anywhere waits for a permit, up to `keep_idle` released permits stay with
  the client and serve its next acquires without a round trip (an idle permit still counts
  against the cap).  The moment a request has to queue, the limiter wakes every client's
  poll and idle permits go back; unused ones also go back after `IDLE_RETURN_S`;
* if the lease is lost (limiter restarted, lease expired after a long stall) the client
  registers again and re-queues its waiters, so callers see a delay, not an error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional, cast

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from verl_sf.detached import detached_task
from verl_sf.pool.limiter import (
    DEFAULT_IDLE_EXIT_S,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_LIMITER_NAME,
    LeaseExpired,
    LimiterSettings,
    TokenBucketWorker,
)

logger = logging.getLogger(__name__)

IDLE_RETURN_S = 1.0
_RECONNECT_ATTEMPTS = 5
_RECONNECT_BACKOFF_S = 0.5
# A live limiter answers long-polls; this many concurrent calls covers thousands of clients.
_LIMITER_MAX_CONCURRENCY = 10_000

_RemoteLimiter = ray.remote(TokenBucketWorker)


def limiter_handle(rate_limit: int = 10, requests_per_second: Optional[float] = None, *,
                   name: str = DEFAULT_LIMITER_NAME, namespace: Optional[str] = None,
                   idle_exit_s: float = DEFAULT_IDLE_EXIT_S) -> ray.actor.ActorHandle:
    """Get the named limiter of this namespace, creating it if needed.

    Detached, so it is not owned by (and does not die with) the worker that happens to
    create it; it removes itself `idle_exit_s` after its last lease is gone.  The limits
    given here only apply when this call creates it — a client's `register` reconciles them.
    """
    return cast(ray.actor.ActorHandle, _RemoteLimiter.options(
        name=name, namespace=namespace, get_if_exists=True, lifetime="detached",
        num_cpus=0, max_concurrency=_LIMITER_MAX_CONCURRENCY, max_restarts=0,
    ).remote(rate_limit=rate_limit, requests_per_second=requests_per_second, name=name,
             idle_exit_s=idle_exit_s))


def shutdown_global_limiter(name: str = DEFAULT_LIMITER_NAME, namespace: Optional[str] = None,
                            timeout_s: float = 30.0) -> bool:
    """Kill the named limiter now; returns False if there was none.

    Returns once the name is free, so the next pool creates a fresh limiter.  Clients still
    running re-register with that new limiter on their next call.
    """
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    ray.kill(handle, no_restart=True)
    killed = handle._actor_id
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ray.get_actor(name, namespace=namespace)._actor_id != killed:
                return True  # a live client already created the next one
        except ValueError:
            return True
        time.sleep(0.05)
    raise TimeoutError(f"limiter {name!r} was killed but its name is still registered after {timeout_s:g} s")


class LimiterClient:
    """Acquire/release cluster-wide permits from one event loop.  Not thread-safe.

    `keep_idle`: how many released permits this client may keep for its own next acquires
    while no request anywhere is waiting (0 = always hand them straight back; the pool
    uses its `num_workers`).  Ignored with `requests_per_second`, whose bucket must count
    every execution.
    """

    def __init__(self, rate_limit: int = 10, requests_per_second: Optional[float] = None, *,
                 name: str = DEFAULT_LIMITER_NAME, namespace: Optional[str] = None,
                 lease_ttl_s: float = DEFAULT_LEASE_TTL_S, client_name: Optional[str] = None,
                 keep_idle: int = 0):
        LimiterSettings(rate_limit=rate_limit, requests_per_second=requests_per_second, lease_ttl_s=lease_ttl_s,
                        keep_idle=keep_idle)
        self.rate_limit = rate_limit
        self.requests_per_second = requests_per_second
        self.name = name
        self.namespace = namespace
        self.lease_ttl_s = float(lease_ttl_s)
        self.client_name = client_name or f"{socket.gethostname()}:{os.getpid()}"
        # A token bucket must see every execution, so idle permits are never kept with one.
        self.keep_idle = 0 if requests_per_second is not None else keep_idle
        self._handle: Any = None  # the limiter's ray.actor.ActorHandle once connected (methods typed at run time)
        self._lease: Optional[str] = None
        self._connect_lock: Optional[asyncio.Lock] = None
        self._pending: dict[str, asyncio.Future] = {}   # permit -> waiter, insertion = FIFO
        self._to_enqueue: list[str] = []
        self._to_release: list[str] = []
        self._held: set[str] = set()          # granted to this lease, not returned (idle included)
        self._idle: collections.deque[tuple[str, float]] = collections.deque()  # (permit, idle since)
        self._idle_timer: Optional[asyncio.TimerHandle] = None
        self._contended = True                # until the limiter says otherwise
        self._sender: Optional[asyncio.Task] = None
        self._poller: Optional[asyncio.Task] = None
        self._closed = False

    # ---- public API -----------------------------------------------------------------------

    async def connect(self) -> dict[str, Any]:
        """Register a lease now (otherwise the first acquire does).  Returns the limiter's reply."""
        self._check_open()
        async with self._lock():
            if self._lease is not None:
                return {"lease": self._lease}
            return await self._register()

    async def acquire(self) -> str:
        """Wait (FIFO, cluster-wide) for a permit; returns its id for `release`."""
        if self._lease is None:
            await self.connect()
        self._check_open()
        if self._idle and not self._contended and not self._pending:
            return self._idle.pop()[0]  # most recently used first; old ones age out
        permit = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._pending[permit] = future
        self._to_enqueue.append(permit)
        self._kick()
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(permit, future)
            raise

    def release(self, permit: str) -> None:
        """Return a permit.  Never blocks: it is kept idle (nobody waits) or batched into
        the next round trip."""
        if permit not in self._held:
            return  # granted under a lease that was lost: the limiter already took it back
        if self._contended or len(self._idle) >= self.keep_idle:
            self._give_back(permit)
            self._kick()
        else:
            self._idle.append((permit, time.monotonic()))
            if self._idle_timer is None:
                self._idle_timer = asyncio.get_running_loop().call_later(IDLE_RETURN_S, self._age_idle)

    @contextlib.asynccontextmanager
    async def permit(self) -> AsyncIterator[str]:
        """Hold one permit for the body of the `async with`; returned on any exit."""
        permit = await self.acquire()
        try:
            yield permit
        finally:
            self.release(permit)

    async def stats(self) -> dict[str, Any]:
        """The limiter's `stats()` plus this client's view."""
        await self.connect()
        stats = await self._handle.stats.remote()
        stats["client"] = {"name": self.client_name, "waiting": len(self._pending), "held": len(self._held),
                           "idle": len(self._idle), "unsent_releases": len(self._to_release)}
        return stats

    async def close(self) -> None:
        """Flush releases, close the lease (returning anything still held) and stop."""
        if self._closed:
            return
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._sender is not None:
            with contextlib.suppress(Exception):
                await self._sender
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(BaseException):
                await self._poller
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RuntimeError("LimiterClient closed while waiting for a permit"))
        self._pending.clear()
        if self._lease is not None and self._handle is not None:
            with contextlib.suppress(RayActorError, ActorUnavailableError):
                await self._handle.unregister.remote(self._lease)
        self._lease = None

    def abandon(self) -> None:
        """Give the lease up without awaiting: for a client whose event loop has closed (its
        poller and sender cannot run any more).  The limiter takes back every permit the
        lease held or waited for at once, instead of after `lease_ttl_s`."""
        if self._closed:
            return
        self._closed = True
        if self._lease is not None and self._handle is not None:
            self._handle.unregister.remote(self._lease)  # fire and forget: nothing here can await it
        self._lease = None

    # ---- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("LimiterClient is closed")

    async def _register(self) -> dict[str, Any]:
        self._handle = limiter_handle(self.rate_limit, self.requests_per_second, name=self.name,
                                      namespace=self.namespace)
        reply = await self._handle.register.remote(self.client_name, self.rate_limit, self.requests_per_second,
                                                   self.lease_ttl_s)
        if reply["reconfigured_from"] is not None:
            logger.warning("limiter %r changed from %s to rate_limit=%s requests_per_second=%s by this client",
                           self.name, reply["reconfigured_from"], self.rate_limit, self.requests_per_second)
        self._lease = reply["lease"]
        if self._poller is None or self._poller.done():
            self._poller = detached_task(self._poll_forever())
        return reply

    async def _recover(self, failed_lease: Optional[str], error: BaseException) -> bool:
        """Lease or limiter lost: register again and re-queue every waiter, oldest first.

        Called by the sender and the poller alike; whoever comes second finds a new lease
        and returns.  Returns False (with every waiter failed) if no limiter could be reached.
        """
        async with self._lock():
            if self._closed:  # abandoned (its lease handed back): not registered again
                self._fail_waiters(RuntimeError("LimiterClient closed while waiting for a permit"))
                return False
            if self._lease is not None and self._lease != failed_lease:
                return True
            logger.warning("limiter %r: %s; registering again (%d waiter(s) re-queued)",
                           self.name, error, len(self._pending))
            self._lease = None
            for attempt in range(_RECONNECT_ATTEMPTS):
                try:
                    await self._register()
                    break
                except (RayActorError, ActorUnavailableError) as exc:  # a dying limiter still owns the name
                    if attempt == _RECONNECT_ATTEMPTS - 1:
                        self._fail_waiters(exc)
                        return False
                    await asyncio.sleep(_RECONNECT_BACKOFF_S * (attempt + 1))
            # Releases belong to the old lease, whose permits the limiter already took back.
            self._to_release.clear()
            self._held.clear()
            self._idle.clear()
            self._contended = True
            self._to_enqueue = list(self._pending)
            self._kick()
            return True

    def _fail_waiters(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        self._to_enqueue.clear()

    def _lock(self) -> asyncio.Lock:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        return self._connect_lock

    def _kick(self) -> None:
        if self._lease is not None and (self._sender is None or self._sender.done()):
            self._sender = detached_task(self._send_forever())

    async def _send_forever(self) -> None:
        """Carry queued enqueues/releases, one round trip at a time (so order is preserved)."""
        while (self._to_enqueue or self._to_release) and self._lease is not None:
            lease = self._lease
            enqueue, self._to_enqueue = self._to_enqueue, []
            release, self._to_release = self._to_release, []
            try:
                reply = await self._handle.update.remote(lease, enqueue, release)
            except ActorUnavailableError:
                # Transient; the batch may or may not have landed (resending is safe).
                self._ask_again()
                self._to_release[:0] = release
                await asyncio.sleep(_RECONNECT_BACKOFF_S)
                continue
            except (LeaseExpired, RayActorError) as exc:
                if not await self._recover(lease, exc):
                    return
                continue
            self._deliver(reply)

    async def _poll_forever(self) -> None:
        timeout = self.lease_ttl_s / 3
        while not self._closed and self._lease is not None:
            lease = self._lease
            try:
                reply = await self._handle.poll.remote(lease, timeout, self._contended)
            except ActorUnavailableError:
                self._ask_again()
                await asyncio.sleep(_RECONNECT_BACKOFF_S)
                continue
            except (LeaseExpired, RayActorError) as exc:
                if not await self._recover(lease, exc):
                    return
                continue
            self._deliver(reply)

    def _ask_again(self) -> None:
        """After a reply Ray reported lost, which may have carried grants: every permit still waited for
        is asked for again.  The limiter queues an id once, grants again what this lease holds, and
        ignores unknown releases."""
        self._to_enqueue = list(self._pending)
        self._kick()

    def _deliver(self, reply: tuple[list[str], bool]) -> None:
        grants, self._contended = reply
        if self._contended:
            self._give_back_idle()
        for permit in grants:
            if permit in self._held:
                continue  # granted again, for a request resent after a lost reply: already delivered
            future = self._pending.pop(permit, None)
            if future is None or future.done():
                # Its waiter gave up while the grant was on its way, and may have withdrawn the request
                # already (the limiter then counts it no more): given back, never kept idle.
                self._to_release.append(permit)
                self._kick()
            else:
                self._held.add(permit)
                future.set_result(permit)

    def _abandon(self, permit: str, future: asyncio.Future) -> None:
        """A waiter was cancelled: withdraw its request, or return the permit it just got."""
        if self._pending.pop(permit, None) is not None:
            if permit in self._to_enqueue:
                self._to_enqueue.remove(permit)
            else:  # withdraw the request queued at the limiter
                self._to_release.append(permit)
                self._kick()
        elif future.done() and not future.cancelled() and future.exception() is None:
            self.release(permit)

    def _give_back(self, permit: str) -> None:
        self._held.discard(permit)
        self._to_release.append(permit)

    def _give_back_idle(self, idle_for_s: float = 0.0) -> None:
        """Return idle permits that have been idle at least `idle_for_s` seconds."""
        cutoff = time.monotonic() - idle_for_s
        returned = 0
        while self._idle and self._idle[0][1] <= cutoff:
            self._give_back(self._idle.popleft()[0])
            returned += 1
        if returned:
            self._kick()

    def _age_idle(self) -> None:
        self._idle_timer = None
        self._give_back_idle(IDLE_RETURN_S)
        if self._idle:
            self._idle_timer = asyncio.get_running_loop().call_later(IDLE_RETURN_S, self._age_idle)
