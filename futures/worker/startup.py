"""What the worker does before Faust runs: check what it can, then wait for its brokers and topics.

Every check here fails with one line that says what to fix (the caller prints it and exits
with status 2): a data dir that cannot be made, a web port that is taken. A worker started
before its brokers answer or before its topics exist does not exit: it logs what it waits
for and retries with back-off (:mod:`ktimers.waiting`), while its web port answers the
probes — ``/healthz`` live, ``/readyz`` not ready, saying why — so that an orchestrator
neither restarts it nor sends it work. Faust then takes the port over.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from futures.worker.config import WorkerConfig
from ktimers.errors import ConfigError
from ktimers.topics import quiet_admin_client, verify_topics
from ktimers.waiting import wait_for

log = logging.getLogger("futures.worker.startup")


def make_data_dir(path: Path) -> None:
    """Create the tables' directory now, so that one that cannot be made is a clear error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"TIMERS_DATA_DIR={str(path)!r}: cannot create or write it ({exc.strerror or exc}). "
            "Point it at a directory this user can write"
        ) from exc


class WaitingProbes:
    """The web port's probes while the worker waits: live, not ready (503) with the reason."""

    def __init__(self, host: str, port: int) -> None:
        self._reason = "starting"
        self._lock = threading.Lock()
        try:
            self._server = ThreadingHTTPServer((host, port), self._handler())
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise ConfigError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc}. "
                + (
                    "Another process listens there: stop it, or set TIMERS_WEB_PORT to a free port"
                    if taken
                    else "Set TIMERS_WEB_HOST to an address of this host"
                )
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()

    def waiting(self, reason: str) -> None:
        with self._lock:
            self._reason = reason

    def reason(self) -> str:
        with self._lock:
            return self._reason

    def close(self) -> None:
        """Free the port for Faust's web server."""
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        probes = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._reply(200, {"status": "ok"})
                else:
                    self._reply(503, {"status": "waiting", "reason": probes.reason()})

            def _reply(self, status: int, body: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        return Handler


def wait_for_topics(config: WorkerConfig, stopped: Callable[[], bool]) -> int | None:
    """The partition count, once the brokers answer and the topics are there and co-partitioned;
    None if ``stopped()`` first. While waiting, the web port answers the probes.

    Raises :class:`ConfigError` when the web port cannot be served and
    :class:`~ktimers.errors.TopicLayoutError` for a layout that waiting does not fix.
    """
    probes = WaitingProbes(config.web_host, config.web_port)
    try:
        kafka = config.common.kafka
        admin = quiet_admin_client(kafka)
        probes.waiting(f"waiting for Kafka at {kafka.bootstrap_servers}")
        return wait_for(
            lambda: verify_topics(config.common, admin=admin, timeout_s=5.0),
            who="futures worker",
            log=log,
            stopped=stopped,
            on_wait=probes.waiting,
        )
    finally:
        probes.close()
