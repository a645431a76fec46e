"""Prometheus metrics, in a registry of their own so several servers can live in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Optional, Union

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from verl_sf.executor import Executor
from verl_sf.executor.status import ExecutorStatus
from verl_sf.models import RunStatus
from verl_sf.server.connections import ConnectionLimit

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, executor: Executor, connections: ConnectionLimit):
        self.registry = CollectorRegistry()
        self.runs = Counter("verl_sf_runs", "Finished requests by endpoint, language and status",
                            ["endpoint", "language", "status"], registry=self.registry)
        self.latency = Histogram("verl_sf_request_duration_seconds", "Request latency, queue wait included",
                                 ["endpoint", "language"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("verl_sf_queue_wait_seconds", "Time spent waiting for a sandbox slot",
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rejections = Counter("verl_sf_rejections", "Requests refused before running, by reason",
                                  ["reason"], registry=self.registry)
        self.registry.register(_StatusCollector(executor, connections))

    def record_run(self, endpoint: str, language: str, status: RunStatus, queue_wait: Optional[float],
                   seconds: float) -> None:
        """A finished request: its outcome, its latency and its wait for a slot."""
        self.runs.labels(endpoint, language, status.value).inc()
        self.latency.labels(endpoint, language).observe(seconds)
        if queue_wait is not None:
            self.queue_wait.observe(queue_wait)

    def render(self) -> bytes:
        return generate_latest(self.registry)


GAUGES: dict[str, tuple[str, Callable[[ExecutorStatus, ConnectionLimit], float]]] = {
    "verl_sf_runs_in_flight": ("Runs admitted and not yet answered", lambda status, _: status.in_flight),
    "verl_sf_queue_depth": ("Runs waiting for a CPU slot", lambda status, _: status.queued),
    "verl_sf_slots": ("CPU slots: runs in their first CPU slice at once", lambda status, _: status.slots),
    "verl_sf_sessions_live": ("Live sessions", lambda status, _: status.sessions),
    "verl_sf_connections_open": ("Open client connections", lambda _, connections: connections.open),
}
COUNTERS: dict[str, tuple[str, Callable[[ExecutorStatus, ConnectionLimit], float]]] = {
    "verl_sf_runs_cancelled": ("Runs dropped because their client went away",
                               lambda status, _: status.counts.cancelled),
    "verl_sf_cpu_starved_timeouts": ("Time-outs in which the run mostly waited for a CPU",
                                     lambda status, _: status.counts.cpu_starved),
    "verl_sf_sessions_created": ("Sessions created", lambda status, _: status.counts.sessions_created),
    "verl_sf_sessions_expired": ("Sessions ended by idle TTL or maximum lifetime",
                                 lambda status, _: status.counts.sessions_expired),
    "verl_sf_sessions_killed": ("Sessions that died (memory, exit, time-out kill)",
                                lambda status, _: status.counts.sessions_killed),
    "verl_sf_connections_evicted": ("Waiting connections closed at --max-connections to let a new one in",
                                    lambda _, connections: connections.evicted),
    "verl_sf_connections_refused": ("New connections answered 503: every open one was busy",
                                    lambda _, connections: connections.refused),
}


class _StatusCollector(Collector):
    """The executor's gauges and counters, from one status snapshot per scrape (counters are exposed
    as `<name>_total`, as Prometheus counters are)."""

    def __init__(self, executor: Executor, connections: ConnectionLimit):
        self._executor, self._connections = executor, connections

    def collect(self) -> Iterator[Union[GaugeMetricFamily, CounterMetricFamily]]:
        status = self._executor.status()
        for name, (documentation, read) in GAUGES.items():
            yield GaugeMetricFamily(name, documentation, value=read(status, self._connections))
        for name, (documentation, read) in COUNTERS.items():
            yield CounterMetricFamily(name, documentation, value=read(status, self._connections))
