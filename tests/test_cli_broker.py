"""The ``timers`` commands on a running broker: ``timers broker`` (only the embedded broker, with
the line to paste, until Ctrl-C) and ``timers watch`` (records as they arrive)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

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


def test_watch_waits_for_a_topic_created_by_its_first_record(broker_env: dict[str, str]) -> None:
    """A callback topic often appears with the first callback: a watch with --timeout waits for it."""
    topic = f"watch-{uuid.uuid4().hex[:8]}"
    watch = subprocess.Popen(
        [TIMERS, "watch", topic, "--from-beginning", "--count", "1", "--timeout", "30s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **broker_env},
    )
    try:
        time.sleep(1.5)  # the watch is up and has found no such topic
        assert watch.poll() is None
        admin = AdminClient({"bootstrap.servers": broker_env["KAFKA_BOOTSTRAP_SERVERS"]})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result()
        producer = Producer({"bootstrap.servers": broker_env["KAFKA_BOOTSTRAP_SERVERS"]})
        producer.produce(topic, b"hello", b"k")
        assert producer.flush(10) == 0
        out, err = watch.communicate(timeout=40)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert (watch.returncode, err) == (0, "")
    assert '"value": "hello"' in out


def test_watch_of_a_missing_topic_fails_with_the_fix(broker_env: dict[str, str]) -> None:
    env = {**os.environ, **broker_env}
    missing = f"no-such-{uuid.uuid4().hex[:8]}"
    at_once = subprocess.run([TIMERS, "watch", missing], capture_output=True, text=True, env=env, timeout=30)
    assert at_once.returncode == 2
    assert f"topic '{missing}' does not exist" in at_once.stderr
    assert "give --timeout to wait for it" in at_once.stderr
    started = time.monotonic()
    waited = subprocess.run(
        [TIMERS, "watch", missing, "--timeout", "2s"], capture_output=True, text=True, env=env, timeout=30
    )
    assert waited.returncode == 2
    assert time.monotonic() - started >= 2
    assert f"topic '{missing}' does not exist" in waited.stderr
