"""Prometheus metrics of the futures worker (served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Lateness buckets (seconds): sub-second resolution matters to users of precise
# timers, minutes matter after an outage.
LATENESS_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    3600.0,
)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.pending = Gauge(
            "timers_pending", "Pending timers held by this worker", ["partition"], registry=r
        )
        self.watermark = Gauge(
            "timers_watermark_seconds",
            "Epoch second up to which timers have fired",
            ["partition"],
            registry=r,
        )
        self.scheduled = Counter("timers_scheduled_total", "Timers accepted into the table", registry=r)
        self.fired = Counter("timers_fired_total", "Callbacks delivered", registry=r)
        self.cancelled = Counter("timers_cancelled_total", "Timers removed by a cancel request", registry=r)
        self.cancel_missed = Counter(
            "timers_cancel_missed_total", "Cancel requests that found nothing pending", registry=r
        )
        self.rejected = Counter(
            "timers_rejected_total", "Requests or callbacks dead-lettered or dropped", ["reason"], registry=r
        )
        self.lateness = Histogram(
            "timers_fire_lateness_seconds", "Fire time minus due time", buckets=LATENESS_BUCKETS, registry=r
        )
        self.ticks = Counter(
            "timers_ticks_total",
            "Ticks by outcome: advanced the clock, duplicate/old (no-op), ahead of the worker clock, invalid",
            ["outcome"],
            registry=r,
        )
        self.dispatch_retries = Counter(
            "timers_dispatch_transient_failures_total",
            "Callbacks kept for the next tick after a transient delivery error",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
