"""``GET /healthz``, ``GET /readyz`` and ``GET /metrics`` over HTTP, for probes and Prometheus.

Live and ready answer different questions, and a probe that mixes them does harm:

* ``/healthz`` (liveness): the process works — its loop turns. Only a restart helps when
  it does not. A broker outage is no reason: a restarted oscillator would find the same
  brokers, and restarts in a loop only add a crash-loop back-off to the outage.
* ``/readyz`` (readiness): the oscillator does its job — a tick was *delivered*
  (acknowledged by the broker) recently, not merely produced: a producer that queues
  ticks for a broker it cannot reach looks busy but advances no worker's clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from oscillator.metrics import OscillatorMetrics

log = logging.getLogger(__name__)

Monotonic = Callable[[], float]
"""A clock that never steps back, in seconds, like :func:`time.monotonic`."""

#: ``/healthz`` fails when the loop has not turned for this long (seconds). It turns every
#: 50 ms while ticking; while waiting for the brokers, a metadata request holds it up to 5 s.
STALLED_AFTER_S = 20.0


class Liveness:
    """Whether the oscillator's loop turns: :meth:`beat` on every turn. Thread-safe."""

    def __init__(self, stalled_after_s: float = STALLED_AFTER_S, clock: Monotonic = time.monotonic) -> None:
        self._stalled_after_s = stalled_after_s
        self._clock = clock
        self._beat_at = clock()
        self._lock = threading.Lock()

    def beat(self) -> None:
        """Record that the loop turned just now."""
        now = self._clock()
        with self._lock:
            self._beat_at = now

    def check(self) -> tuple[bool, str]:
        """(alive, reason)."""
        with self._lock:
            age_s = self._clock() - self._beat_at
        if age_s <= self._stalled_after_s:
            return True, "ok"
        return (
            False,
            f"the tick loop has not turned for {age_s:.1f}s (stalled after {self._stalled_after_s:g}s)",
        )


class Readiness:
    """Whether ticks are getting through, judged by the age of the last delivery.

    Uses a monotonic clock, so a wall-clock step (NTP) neither hides nor fakes
    staleness. Thread-safe: delivery reports and HTTP threads share it.
    """

    def __init__(self, stale_after_s: float, clock: Monotonic = time.monotonic) -> None:
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._last_delivery_at: float | None = None
        self._waiting = "no tick delivered yet"
        self._lock = threading.Lock()

    def delivered(self) -> None:
        """Record that the broker acknowledged a tick just now."""
        now = self._clock()
        with self._lock:
            self._last_delivery_at = now

    def waiting(self, reason: str) -> None:
        """What the oscillator waits for before its first tick (shown while not ready)."""
        with self._lock:
            self._waiting = reason

    def check(self) -> tuple[bool, str]:
        """(ready, reason). Not ready until the first delivery."""
        now = self._clock()
        with self._lock:
            last, waiting = self._last_delivery_at, self._waiting
        if last is None:
            return False, waiting
        age_s = now - last
        if age_s <= self._stale_after_s:
            return True, "ok"
        return False, f"last tick delivered {age_s:.1f}s ago (stale after {self._stale_after_s:g}s)"


class HealthServer:
    """A small HTTP server in a daemon thread: ``/healthz``, ``/readyz`` and ``/metrics``."""

    def __init__(
        self, host: str, port: int, liveness: Liveness, readiness: Readiness, metrics: OscillatorMetrics
    ) -> None:
        handler = _handler_class(liveness, readiness, metrics)
        # Binding here, not in start(), makes a taken port fail at startup with an OSError.
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._serve, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        """The bound TCP port (useful when constructed with port 0)."""
        return int(self._server.server_address[1])

    def _serve(self) -> None:
        # A short poll interval keeps stop() well inside the shutdown budget.
        self._server.serve_forever(poll_interval=0.1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler_class(
    liveness: Liveness, readiness: Readiness, metrics: OscillatorMetrics
) -> type[BaseHTTPRequestHandler]:
    checks = {"/healthz": liveness.check, "/readyz": readiness.check}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in checks:
                ok, reason = checks[path]()
                self._reply(200 if ok else 503, "text/plain; charset=utf-8", reason.encode())
            elif path == "/metrics":
                self._reply(200, CONTENT_TYPE_LATEST, metrics.render())
            else:
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /healthz, /readyz or /metrics")

        def _reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes hit this every few seconds: keep them out of the INFO log.
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
