"""``timers broker``: only the embedded broker, with the line to paste, until Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from ktimers.config import TopicsConfig

TIMERS = str(Path(sys.executable).with_name("timers"))

pytestmark = pytest.mark.integration


def _read_until(process: subprocess.Popen[str], marker: str, timeout_s: float = 30) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines
    pytest.fail(f"no {marker!r} in the output: {lines}")


def test_timers_broker_serves_until_interrupted_and_says_how_to_connect() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TIMERS_"))}
    process = subprocess.Popen(
        [TIMERS, "broker", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        lines = _read_until(process, "Ctrl-C")
        export = next(line for line in lines if line.strip().startswith("export "))
        settings = dict(item.split("=", 1) for item in export.split()[1:])
        assert settings["TIMERS_BROKER_PROFILE"] == "embedded"
        bootstrap = settings["KAFKA_BOOTSTRAP_SERVERS"]
        assert bootstrap.startswith("127.0.0.1:")
        # The service's topics are there: a worker or the CLI can start right away.
        topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
        defaults = TopicsConfig()
        assert {defaults.oscillator, defaults.request, defaults.events, defaults.dlq} <= set(topics)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0
        host, port = bootstrap.split(":")
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=1):
            pass  # the broker went with it
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_timers_broker_on_a_port_in_use_says_so() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [TIMERS, "broker", "--port", str(port)], capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 2
    assert f"127.0.0.1:{port} is in use" in done.stderr
