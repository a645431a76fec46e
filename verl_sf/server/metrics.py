"""Prometheus metrics, in a registry of their own so several servers can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from verl_sf.executor import Executor

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, executor: Executor):
        self.registry = CollectorRegistry()
        self.runs = Counter("verl_sf_runs", "Finished requests by endpoint, language and status",
                            ["endpoint", "language", "status"], registry=self.registry)
        self.latency = Histogram("verl_sf_request_duration_seconds", "Request latency, queue wait included",
                                 ["endpoint", "language"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("verl_sf_queue_wait_seconds", "Time spent waiting for a sandbox slot",
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rejections = Counter("verl_sf_rejections", "Requests refused before running, by reason",
                                  ["reason"], registry=self.registry)
        in_flight = Gauge("verl_sf_runs_in_flight", "Runs executing now", registry=self.registry)
        in_flight.set_function(lambda: executor.stats.in_flight)
        queued = Gauge("verl_sf_queue_depth", "Requests waiting for a sandbox slot", registry=self.registry)
        queued.set_function(lambda: executor.stats.queued)
        slots = Gauge("verl_sf_workers", "Sandbox slots (runs that can execute at once)", registry=self.registry)
        slots.set(executor.config.workers)

    def render(self) -> bytes:
        return generate_latest(self.registry)
