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

import io
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from oscillator.metrics import OscillatorMetrics

log = logging.getLogger(__name__)

Monotonic = Callable[[], float]
"""A clock that never steps back, in seconds, like :func:`time.monotonic`."""

#: ``/healthz`` fails when the loop has not turned for this long (seconds). It turns every
#: 50 ms while ticking; while waiting for the brokers, a metadata request holds it up to 5 s.
STALLED_AFTER_S = 20.0


@dataclass(frozen=True)
class HttpLimits:
    """What the health server gives one client: probes and scrapes send a few hundred bytes at once.

    A client that sends nothing, or drips its request, is dropped when ``request_timeout_s``
    runs out, whatever each read waits; reading stops at ``max_request_bytes`` (431); and
    at most ``max_connections`` are served at once, any more closed at once, so clients
    that hold connections open cannot take threads without bound.
    """

    request_timeout_s: float = 5.0
    max_request_bytes: int = 16 * 1024
    max_connections: int = 32


#: At most one warning in this many seconds while connections are refused (a full server).
REFUSED_WARNING_EVERY_S = 60.0


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
        self,
        host: str,
        port: int,
        liveness: Liveness,
        readiness: Readiness,
        metrics: OscillatorMetrics,
        limits: HttpLimits = HttpLimits(),
    ) -> None:
        handler = _handler_class(liveness, readiness, metrics, limits)
        # Binding here, not in start(), makes a taken port fail at startup with an OSError.
        self._server = _BoundedServer((host, port), handler, limits.max_connections)
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


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, up to ``max_connections``; a connection over that is closed at once."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_connections = max_connections
        self._warned_at: float | None = None
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._warn_full(client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _warn_full(self, client_address: Any) -> None:
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= REFUSED_WARNING_EVERY_S:
            self._warned_at = now
            log.warning(
                "health server: %d connections open, closing one from %s: probes may fail until "
                "clients that hold connections open (or send nothing) let go",
                self._max_connections,
                client_address,
            )


class _RequestReader(io.RawIOBase):
    """A connection's bytes until the request's deadline, then TimeoutError; none past a budget.

    The socket's own timeout bounds one read; a client that drips a byte at a time would
    reset it at every byte, so each read waits only what is left of the whole request's time.
    """

    def __init__(self, connection: socket.socket, timeout_s: float, max_bytes: int) -> None:
        super().__init__()
        self._connection = connection
        self._deadline = time.monotonic() + timeout_s
        self._left = max_bytes
        self.over_budget = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            self.over_budget = True
            return 0
        remaining_s = self._deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError("the request was not received in time")
        self._connection.settimeout(remaining_s)
        view = memoryview(buffer).cast("B")[: self._left]
        received = self._connection.recv_into(view)
        self._left -= received
        return received


def _handler_class(
    liveness: Liveness, readiness: Readiness, metrics: OscillatorMetrics, limits: HttpLimits
) -> type[BaseHTTPRequestHandler]:
    checks = {"/healthz": liveness.check, "/readyz": readiness.check}

    class Handler(BaseHTTPRequestHandler):
        # Every read and write of the connection; reading the request is bounded further below.
        timeout = limits.request_timeout_s

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the socket closes only once every file made from it is closed
            self._reader = _RequestReader(self.connection, limits.request_timeout_s, limits.max_request_bytes)
            self.rfile = io.BufferedReader(self._reader)

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            if self._reader.over_budget:
                self.send_error(431, f"the request is larger than {limits.max_request_bytes} bytes")
                return False
            # The request is read: the answer gets a whole timeout of its own.
            self.connection.settimeout(self.timeout)
            return True

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
