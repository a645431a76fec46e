"""The cluster-wide limiter: `TokenBucketWorker`, one named Ray actor per namespace.

verl <= 0.7 used a threading semaphore in an actor owned by whichever worker created it:
it died with that worker, kept the first `rate_limit` it was given, and a caller that died
while holding a permit leaked it forever.  This limiter instead

* lives as a *detached* named actor (it outlives its creator) and removes itself once no
  client has held a lease for `idle_exit_s` — so it goes away with the job that used it;
* hands out permits under *leases*: every client process registers a lease and keeps it
  alive by long-polling; when a client dies its lease expires and every permit it held or
  waited for is returned;
* grants strictly in arrival order (one FIFO queue for the whole cluster), optionally
  paced by a token bucket (`requests_per_second`);
* applies a different `rate_limit` asked for by a later client (reconfiguration, logged),
  instead of silently keeping the old one.

The protocol is batched so one round trip carries many grants and releases (one Ray call per
permit would cap the grant rate far below what a cluster's rollouts ask; docs/pool.md).  Clients
name their own permit ids, so a release or cancellation can be sent before the grant
arrives.  Use it through `verl_sf.pool.client.LimiterClient`, not directly.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import statistics
import time
import uuid
from typing import Any, Optional

import ray
from pydantic import BaseModel, ConfigDict, Field
from ray.util.metrics import Counter, Gauge, Histogram

from verl_sf.errors import VerlSfError

logger = logging.getLogger(__name__)

DEFAULT_LIMITER_NAME = "verl-sf-rate-limiter"
# Seconds without any lease before the limiter removes itself.
DEFAULT_IDLE_EXIT_S = 60.0
DEFAULT_LEASE_TTL_S = 30.0
_SWEEP_INTERVAL_S = 0.5
_WAIT_SAMPLES = 4096  # wait times kept for the percentiles in stats()
_WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0]


class LeaseExpired(VerlSfError, RuntimeError):
    """The limiter does not know this lease (it expired, or the limiter was replaced).

    Every permit of the lease has been returned; the client must register again.
    """


class LimiterSettings(BaseModel):
    """The numbers a pool, a limiter client and the limiter are given, checked in one place:
    construct it with the ones at hand and a ValidationError (a ValueError) names a bad one."""

    model_config = ConfigDict(strict=True, frozen=True)

    rate_limit: int = Field(10, ge=1)
    """Executions in flight across the namespace (a cap, not a rate, as in verl)."""
    requests_per_second: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    """Optional pace of grants (a token bucket); None: no pace."""
    lease_ttl_s: float = Field(DEFAULT_LEASE_TTL_S, gt=0, le=3600)
    """A client's lease ends (its permits come back) when it has not polled for this long."""
    keep_idle: int = Field(0, ge=0)
    """Released permits a client may keep for its own next acquires while nobody waits."""


@dataclasses.dataclass(eq=False)
class _Lease:
    id: str
    client: str
    ttl: float
    last_seen: float
    polling: int = 0
    held: set[str] = dataclasses.field(default_factory=set)
    queued: set[str] = dataclasses.field(default_factory=set)
    undelivered: list[str] = dataclasses.field(default_factory=list)
    told: bool = True  # the `contended` of its last reply (a new client assumes contention)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def expired(self, now: float) -> bool:
        # A client blocked in poll() is alive by construction: the poll returns within
        # ttl/3 and the client calls again, so only the time since the last call counts.
        return self.polling == 0 and now - self.last_seen > self.ttl


@dataclasses.dataclass(eq=False)
class _Waiter:
    permit: str
    lease: _Lease
    enqueued_at: float
    cancelled: bool = False


class _Metrics:
    """Prometheus-style metrics through Ray's metrics agent (exported with Ray's `ray_` prefix)."""

    def __init__(self, limiter: str):
        self._tags = {"limiter": limiter}
        keys = ("limiter",)
        self.in_flight = Gauge("verl_sf_limiter_permits_in_flight",
                               "Permits granted and not yet returned (executions running).", tag_keys=keys)
        self.queue = Gauge("verl_sf_limiter_queue_length", "Permit requests waiting for a grant.", tag_keys=keys)
        self.rate_limit = Gauge("verl_sf_limiter_rate_limit", "Configured cap on permits in flight.", tag_keys=keys)
        self.leases = Gauge("verl_sf_limiter_leases", "Client leases alive.", tag_keys=keys)
        self.wait = Histogram("verl_sf_limiter_wait_seconds", "Time from request to grant.",
                              boundaries=_WAIT_BUCKETS, tag_keys=keys)
        self.grants = Counter("verl_sf_limiter_grants_total", "Permits granted.", tag_keys=keys)
        self.reclaimed = Counter("verl_sf_limiter_reclaimed_total",
                                 "Permits returned because their holder's lease expired.", tag_keys=keys)

    def set_gauges(self, in_flight: int, queue: int, rate_limit: int, leases: int) -> None:
        self.in_flight.set(in_flight, tags=self._tags)
        self.queue.set(queue, tags=self._tags)
        self.rate_limit.set(rate_limit, tags=self._tags)
        self.leases.set(leases, tags=self._tags)

    def granted(self, wait_s: float) -> None:
        self.wait.observe(wait_s, tags=self._tags)
        self.grants.inc(1, tags=self._tags)

    def reclaimed_permits(self, count: int) -> None:
        self.reclaimed.inc(count, tags=self._tags)


class TokenBucketWorker:
    """Grants execution permits cluster-wide: at most `rate_limit` in flight, FIFO.

    With `requests_per_second` set, grants are additionally paced by a token bucket of that
    rate holding at most max(1, requests_per_second) tokens (one second of burst).
    Run as an async Ray actor (see `client.limiter_handle`); all state lives on one event
    loop, so no locks are needed.
    """

    def __init__(self, rate_limit: int = 10, requests_per_second: Optional[float] = None,
                 name: str = DEFAULT_LIMITER_NAME, idle_exit_s: float = DEFAULT_IDLE_EXIT_S):
        LimiterSettings(rate_limit=rate_limit, requests_per_second=requests_per_second)
        self._name = name
        self._rate_limit = rate_limit
        self._rps: Optional[float] = None
        self._tokens = 0.0
        self._refilled_at = time.monotonic()
        self._refill_timer: Optional[asyncio.TimerHandle] = None
        self._set_rps(requests_per_second)
        self._idle_exit_s = idle_exit_s
        self._leases: dict[str, _Lease] = {}
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._waiting: dict[str, _Waiter] = {}   # permit -> waiter, queued and not granted
        self._holders: dict[str, _Lease] = {}    # permit -> lease, granted and not returned
        self._waits: collections.deque[float] = collections.deque(maxlen=_WAIT_SAMPLES)
        self._counts: collections.Counter[str] = collections.Counter()
        self._contention_signalled = False
        self._sweeper: Optional[asyncio.Task] = None
        self._idle_since = time.monotonic()
        self._started_at = time.time()
        self._metrics = _Metrics(name)

    # ---- client protocol -------------------------------------------------------------

    async def register(self, client: str, rate_limit: int, requests_per_second: Optional[float] = None,
                       lease_ttl_s: float = 30.0) -> dict[str, Any]:
        """Open a lease for one client process and apply its limits.

        A different `rate_limit` / `requests_per_second` than the live one replaces it for
        everyone (last writer wins) and is logged; the reply tells the client what changed.
        """
        LimiterSettings(rate_limit=rate_limit, requests_per_second=requests_per_second, lease_ttl_s=lease_ttl_s)
        self._ensure_sweeper()
        previous = {"rate_limit": self._rate_limit, "requests_per_second": self._rps}
        changed = self._apply(rate_limit, requests_per_second, reason=f"client {client!r}")
        lease = _Lease(id=uuid.uuid4().hex, client=client, ttl=float(lease_ttl_s), last_seen=time.monotonic())
        self._leases[lease.id] = lease
        self._counts["leases_opened"] += 1
        return {"lease": lease.id, "rate_limit": self._rate_limit, "requests_per_second": self._rps,
                "reconfigured_from": previous if changed else None}

    async def update(self, lease_id: str, enqueue: list[str], release: list[str]) -> tuple[list[str], bool]:
        """Return `release`d permits, queue `enqueue` requests.

        Replies `(grants ready now, contended)`; `contended` says someone is waiting, or a pace
        is in force, so clients must hand back idle permits instead of keeping them (see
        LimiterClient).
        A request sent again is queued once, and granted again if this lease holds it: a
        client resends what it still waits for when a reply was lost, grants and all."""
        lease = self._touch(lease_id)
        for permit in release:
            self._return(lease, permit)
        now = time.monotonic()
        for permit in enqueue:
            if permit in self._waiting or permit in self._holders:
                # Sent again because a reply was lost: still queued, or granted in that reply.
                if self._holders.get(permit) is lease and permit not in lease.undelivered:
                    lease.undelivered.append(permit)
                continue
            waiter = _Waiter(permit, lease, now)
            self._queue.append(waiter)
            self._waiting[permit] = waiter
            lease.queued.add(permit)
        self._dispatch()
        return self._reply(lease)

    async def poll(self, lease_id: str, timeout_s: float, contended_seen: bool = False) -> tuple[list[str], bool]:
        """Long-poll: reply like `update` as soon as this lease has grants, or the queue's
        contention differs from what the client last saw (so idle permits come back at
        once when someone starts waiting), or after `timeout_s`.

        Also the lease's heartbeat: a live client always has a poll outstanding.
        """
        lease = self._touch(lease_id)
        # It waits only while what the client saw is what it was last told and still holds: a reply of
        # another call may have told it otherwise since this poll was sent.
        if not lease.undelivered and self._contended() == contended_seen == lease.told:
            lease.wake.clear()
            lease.polling += 1
            try:
                await asyncio.wait_for(lease.wake.wait(), timeout=max(0.0, min(timeout_s, lease.ttl / 2)))
            except asyncio.TimeoutError:
                pass
            finally:
                lease.polling -= 1
                lease.last_seen = time.monotonic()
        if self._leases.get(lease_id) is not lease:
            raise LeaseExpired(f"lease {lease_id} of client {lease.client!r} was dropped while polling")
        return self._reply(lease)

    async def unregister(self, lease_id: str) -> None:
        """Close a lease, returning everything it held or waited for.  Idempotent."""
        lease = self._leases.get(lease_id)
        if lease is not None:
            self._drop(lease, reclaimed=False)
            self._dispatch()

    # ---- administration ----------------------------------------------------------------

    async def configure(self, rate_limit: int, requests_per_second: Optional[float] = None) -> bool:
        """Change the limits for everyone; lowering the cap revokes nothing, it only stops
        new grants until enough permits come back.  Returns whether anything changed."""
        LimiterSettings(rate_limit=rate_limit, requests_per_second=requests_per_second)
        return self._apply(rate_limit, requests_per_second, reason="configure()")

    async def stats(self) -> dict[str, Any]:
        """A snapshot for dashboards and tests; the same numbers feed the Ray metrics."""
        waits = sorted(self._waits)
        return {
            "name": self._name,
            "rate_limit": self._rate_limit,
            "requests_per_second": self._rps,
            "in_flight": len(self._holders),
            "queue_length": len(self._waiting),
            "leases": len(self._leases),
            "leases_opened_total": self._counts["leases_opened"],
            "granted_total": self._counts["granted"],
            "released_total": self._counts["released"],
            "reclaimed_total": self._counts["reclaimed"],
            "leases_expired_total": self._counts["leases_expired"],
            "reconfigurations": self._counts["reconfigurations"],
            "wait_s": {
                "samples": len(waits),
                "mean": statistics.fmean(waits) if waits else 0.0,
                "p50": _quantile(waits, 0.50),
                "p95": _quantile(waits, 0.95),
                "p99": _quantile(waits, 0.99),
                "max": waits[-1] if waits else 0.0,
            },
            "started_at": self._started_at,
            "pid": os.getpid(),
        }

    async def get_current_count(self) -> int:
        """verl <= 0.7's observability call: permits in flight."""
        return len(self._holders)

    # ---- internals -----------------------------------------------------------------------

    def _apply(self, rate_limit: int, requests_per_second: Optional[float], *, reason: str) -> bool:
        if (rate_limit, requests_per_second) == (self._rate_limit, self._rps):
            return False
        logger.warning("limiter %r reconfigured by %s: rate_limit %s -> %s, requests_per_second %s -> %s",
                       self._name, reason, self._rate_limit, rate_limit, self._rps, requests_per_second)
        self._rate_limit = rate_limit
        self._set_rps(requests_per_second)
        self._counts["reconfigurations"] += 1
        self._dispatch()
        return True

    def _set_rps(self, rps: Optional[float]) -> None:
        if self._rps is not None and rps is not None:  # a new pace: the tokens earned so far carry over
            self._refill()
            self._tokens = min(_burst(rps), self._tokens)
        else:  # a pace starts full: the first second of work is not throttled below its rate
            self._tokens = _burst(rps)
            self._refilled_at = time.monotonic()
        self._rps = float(rps) if rps is not None else None
        if self._refill_timer is not None:  # set for the old pace: _dispatch sets one for the new
            self._refill_timer.cancel()
            self._refill_timer = None

    def _touch(self, lease_id: str) -> _Lease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseExpired(f"unknown lease {lease_id}: it expired or this limiter was restarted")
        lease.last_seen = time.monotonic()
        return lease

    def _return(self, lease: _Lease, permit: str) -> None:
        if self._holders.get(permit) is lease:
            del self._holders[permit]
            lease.held.discard(permit)
            if permit in lease.undelivered:  # cancelled by its client before the grant arrived
                lease.undelivered.remove(permit)
            self._counts["released"] += 1
        elif permit in lease.queued:
            self._waiting.pop(permit).cancelled = True
            lease.queued.discard(permit)
        # Anything else was already reclaimed with an expired lease: nothing to return.

    def _contended(self) -> bool:
        """Whether clients must hand idle permits back: someone waits, or a pace is in force (its
        bucket must count every execution)."""
        return bool(self._waiting) or self._rps is not None

    def _dispatch(self) -> None:
        """Grant from the head of the queue while the cap (and the bucket) allows; when
        requests are left waiting for the first time, or a pace is set, wake every client's poll."""
        self._grant()
        if not self._contended():
            self._contention_signalled = False
        elif not self._contention_signalled:
            self._contention_signalled = True
            for lease in self._leases.values():
                lease.wake.set()

    def _grant(self) -> None:
        while self._queue and len(self._holders) < self._rate_limit:
            waiter = self._queue[0]
            if waiter.cancelled:
                self._queue.popleft()
                continue
            if self._rps is not None and not self._take_token():
                self._schedule_refill()
                return
            self._queue.popleft()
            del self._waiting[waiter.permit]
            lease = waiter.lease
            lease.queued.discard(waiter.permit)
            lease.held.add(waiter.permit)
            lease.undelivered.append(waiter.permit)
            lease.wake.set()
            self._holders[waiter.permit] = lease
            wait_s = time.monotonic() - waiter.enqueued_at
            self._waits.append(wait_s)
            self._counts["granted"] += 1
            self._metrics.granted(wait_s)

    def _take_token(self) -> bool:
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def _refill(self) -> None:
        """The tokens earned at the current pace since the last refill, up to its bucket."""
        assert self._rps is not None  # only called with a requests_per_second limit
        now = time.monotonic()
        self._tokens = min(_burst(self._rps), self._tokens + (now - self._refilled_at) * self._rps)
        self._refilled_at = now

    def _schedule_refill(self) -> None:
        if self._refill_timer is None:
            assert self._rps is not None  # only called with a requests_per_second limit
            delay = (1.0 - self._tokens) / self._rps
            self._refill_timer = asyncio.get_running_loop().call_later(delay, self._on_refill)

    def _on_refill(self) -> None:
        self._refill_timer = None
        self._dispatch()

    def _reply(self, lease: _Lease) -> tuple[list[str], bool]:
        grants, lease.undelivered = lease.undelivered, []
        lease.told = self._contended()
        return grants, lease.told

    def _drop(self, lease: _Lease, *, reclaimed: bool) -> None:
        del self._leases[lease.id]
        for permit in lease.held:
            del self._holders[permit]
        for permit in lease.queued:
            self._waiting.pop(permit).cancelled = True
        if reclaimed and lease.held:
            self._counts["reclaimed"] += len(lease.held)
            self._metrics.reclaimed_permits(len(lease.held))
            logger.warning("limiter %r: lease of client %r expired; reclaimed %d permit(s)",
                           self._name, lease.client, len(lease.held))
        lease.held.clear()
        lease.queued.clear()
        lease.undelivered.clear()
        lease.wake.set()  # end a poll still outstanding

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        """Expire dead clients' leases, publish gauges, and leave when nobody is left."""
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL_S)
            now = time.monotonic()
            expired = [lease for lease in self._leases.values() if lease.expired(now)]
            for lease in expired:
                self._counts["leases_expired"] += 1
                self._drop(lease, reclaimed=True)
            if expired:
                self._dispatch()
            self._metrics.set_gauges(len(self._holders), len(self._waiting), self._rate_limit, len(self._leases))
            if self._leases:
                self._idle_since = now
            elif now - self._idle_since > self._idle_exit_s:
                logger.info("limiter %r: no client for %.0f s, exiting", self._name, self._idle_exit_s)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return


def _burst(rps: Optional[float]) -> float:
    """The tokens a bucket of this pace holds at most: one second's worth, and at least one."""
    return max(1.0, rps) if rps else 0.0


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
