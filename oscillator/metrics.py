"""Prometheus metrics of one oscillator process, on a registry of its own.

A dedicated registry (not prometheus_client's global one) keeps tests and any
embedding process from sharing, or double-registering, these series.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class OscillatorMetrics:
    """Counters updated from delivery reports, rendered for ``GET /metrics``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._delivered = Counter(
            "timers_oscillator_ticks_delivered",
            "Tick records the broker acknowledged (one per partition per second).",
            registry=self.registry,
        )
        self._last_second = Gauge(
            "timers_oscillator_last_second_delivered",
            "Highest epoch second (seconds) of a tick the broker acknowledged.",
            registry=self.registry,
        )
        self._errors = Counter(
            "timers_oscillator_produce_errors",
            "Tick records that could not be produced or delivered.",
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._highest: int | None = None

    def delivered(self, second: int) -> None:
        """Count one acknowledged tick record for epoch ``second``."""
        self._delivered.inc()
        with self._lock:
            # Delivery reports of different partitions may arrive out of order;
            # the gauge only moves forward.
            if self._highest is None or second > self._highest:
                self._highest = second
                self._last_second.set(second)

    def failed(self) -> None:
        """Count one tick record that was not delivered."""
        self._errors.inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every series in this registry."""
        return generate_latest(self.registry)
