"""The worker and the oscillator ride out brokers that are not there: at start, and for longer than
the chart's liveness window. Live throughout, not ready meanwhile, serving again on their own.

Each test runs a broker of its own (it is paused or started late), on a port the services were
told about before it listened.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ktimers.broker import EmbeddedBroker, free_port, start_broker
from tests.integration.conftest import STACK_LIMITS, Stack
from tests.processes import Service, SpawnFn
from tools.stack import instance_env

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "helm" / "kafka-timers"


def liveness_window_s() -> float:
    """The longest the chart lets a liveness probe fail before a restart (periodSeconds ×
    failureThreshold), of the oscillator's and the worker's."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    probes = [values[part]["livenessProbe"] for part in ("oscillator", "worker")]
    return max(p["periodSeconds"] * p["failureThreshold"] for p in probes)


def status(port: int, path: str) -> int | None:
    """The HTTP status of ``path`` on 127.0.0.1:``port``; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


class Probes:
    """The probe ports of a worker and an oscillator, read as a kubelet would."""

    def __init__(self, stack: Stack, oscillator: Service) -> None:
        self.ports = {"worker": stack.web_port, "oscillator": int(oscillator.env["TIMERS_OSC_HEALTH_PORT"])}

    def read(self, path: str) -> dict[str, int | None]:
        return {name: status(port, path) for name, port in self.ports.items()}

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until both answer /readyz with 200."""
        started = time.monotonic()
        while set(self.read("/readyz").values()) != {200}:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"not ready after {timeout_s}s: {self.read('/readyz')}")
            time.sleep(0.2)
        return time.monotonic() - started


@pytest.fixture
def broker_port() -> Iterator[tuple[int, list[EmbeddedBroker]]]:
    """A port nothing listens on yet, and the list a test puts the broker it starts there in."""
    brokers: list[EmbeddedBroker] = []
    yield free_port(), brokers
    for broker in brokers:
        os.kill(broker.process.pid, signal.SIGCONT)  # a failed outage test must not leave it frozen
        broker.stop()


def stack_on(port: int, spawn: SpawnFn, tmp_path: Path) -> Stack:
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "TIMERS_BROKER_PROFILE": "embedded",
        **STACK_LIMITS,
        **instance_env(),
    }
    return Stack(env=env, spawn=spawn, data_dir=tmp_path / "worker-data")


def fire_one(stack: Stack, delay_s: float = 1.0, timeout_s: float = 30.0) -> None:
    reader = stack.callback_topic("away")
    with stack.client() as client:
        handle = client.schedule(reader.topic, "k", b"after the brokers came", delay=delay_s)
    fired = reader.read_until(lambda records: len(records) >= 1, timeout_s)
    assert [c.timer_id for c in fired] == [handle.id]


def waiting_lines(service: Service) -> list[str]:
    return [line for line in service.output().splitlines() if " waiting: " in line]


def test_started_before_the_broker_they_wait_live_and_not_ready_then_serve(
    broker_port: tuple[int, list[EmbeddedBroker]], spawn: SpawnFn, tmp_path: Path
) -> None:
    port, brokers = broker_port
    stack = stack_on(port, spawn, tmp_path)
    worker = stack.start_worker(wait=False)
    oscillator = stack.start_oscillator(wait=False)
    probes = Probes(stack, oscillator)

    deadline = time.monotonic() + 30
    while not (waiting_lines(worker) and waiting_lines(oscillator)):
        stack.check()
        assert time.monotonic() < deadline, "no line saying what they wait for"
        time.sleep(0.2)
    time.sleep(3)  # a few retries more: still up, still one line each
    stack.check()
    assert probes.read("/healthz") == {"worker": 200, "oscillator": 200}
    assert probes.read("/readyz") == {"worker": 503, "oscillator": 503}
    for service in (worker, oscillator):
        [line] = waiting_lines(service)
        assert f"cannot reach Kafka at 127.0.0.1:{port}" in line
        assert "KAFKA_BOOTSTRAP_SERVERS" in line
        assert "Traceback" not in service.output()
        assert "%3|" not in service.output()  # librdkafka's own line per failed connection

    brokers.append(start_broker(port=port))
    stack.create_topics()  # what the chart's topics Job does
    to_ready_s = probes.wait_ready(timeout_s=60)
    fire_one(stack)
    stack.check()
    assert (worker.starts, oscillator.starts) == (1, 1)
    print(f"ready {to_ready_s:.1f}s after the broker started")


def test_a_broker_outage_longer_than_the_liveness_window_restarts_nothing(
    broker_port: tuple[int, list[EmbeddedBroker]], spawn: SpawnFn, tmp_path: Path
) -> None:
    port, brokers = broker_port
    brokers.append(start_broker(port=port))
    broker = brokers[0]
    stack = stack_on(port, spawn, tmp_path).create_topics()
    worker = stack.start_worker()
    oscillator = stack.start_oscillator()
    stack.wait_for_tick(timeout_s=60)
    probes = Probes(stack, oscillator)
    probes.wait_ready(timeout_s=30)
    outage_s = liveness_window_s() + 10
    reader = stack.callback_topic("outage")
    with stack.client() as client:
        # Due while the broker is frozen: it fires once the broker is back.
        handle = client.schedule(reader.topic, "k", b"due in the outage", delay=outage_s / 2)

    os.kill(broker.process.pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    not_live: list[tuple[float, dict[str, int | None]]] = []
    not_ready_since: dict[str, float] = {}
    while (elapsed := time.monotonic() - paused_at) < outage_s:
        live = probes.read("/healthz")
        if set(live.values()) != {200}:
            not_live.append((elapsed, live))
        for name, code in probes.read("/readyz").items():
            if code != 200:
                not_ready_since.setdefault(name, elapsed)
        time.sleep(1.0)
    os.kill(broker.process.pid, signal.SIGCONT)
    back_s = probes.wait_ready(timeout_s=60)
    fired = reader.read_until(lambda records: len(records) >= 1, timeout_s=30)
    resumed_s = time.monotonic() - paused_at - outage_s

    assert not_live == [], "a liveness probe failed during the outage"
    assert set(not_ready_since) == {"worker", "oscillator"}, "readiness never said the brokers were gone"
    assert back_s < 20
    assert [c.timer_id for c in fired] == [handle.id]
    stack.check()
    assert (worker.starts, oscillator.starts) == (1, 1)
    stack.wait_for_metric("timers_ticks_total", lambda n: n > 0, timeout_s=5)
    for service, lost, back in (
        (worker, "lost its brokers", "reaches its brokers"),
        (oscillator, "not delivered", "acknowledged again"),
    ):
        assert lost in service.output() and back in service.output()
    print(
        f"outage {outage_s:g}s: not ready after {not_ready_since}; ready again {back_s:.1f}s and the "
        f"due timer fired {resumed_s:.1f}s after the broker resumed"
    )


def test_an_outage_with_callbacks_on_their_way_dead_letters_none_and_fires_all(
    broker_port: tuple[int, list[EmbeddedBroker]], spawn: SpawnFn, tmp_path: Path
) -> None:
    # Precise mode sends callbacks all the time, so the pause catches some on their way: they time
    # out (30 s), and the embedded broker then refused their producer for good (fenced).
    port, brokers = broker_port
    brokers.append(start_broker(port=port))
    broker = brokers[0]
    stack = stack_on(port, spawn, tmp_path).create_topics()
    stack.env["TIMERS_PRECISE"] = "1"
    worker = stack.start_worker()
    stack.start_oscillator()
    stack.wait_for_tick(timeout_s=60)
    reader = stack.callback_topic("in-flight")
    count, now = 4000, time.time()
    with stack.client() as client:
        due = {
            client.schedule(reader.topic, f"k{i}", b"x", at=now + 4 + 16 * i / count).id for i in range(count)
        }

    time.sleep(6)  # a quarter of them sent, the rest on their way or to come
    os.kill(broker.process.pid, signal.SIGSTOP)
    time.sleep(45)  # past the callbacks' 30 s delivery timeout
    os.kill(broker.process.pid, signal.SIGCONT)
    fired = reader.read_until(lambda records: due <= {c.timer_id for c in records}, timeout_s=60)

    assert due - {c.timer_id for c in fired} == set()
    assert stack.metric_sum("timers_rejected_total") == 0  # no callback dead-lettered
    stack.check()
    assert worker.starts == 1
