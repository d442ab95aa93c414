"""Fixtures for end-to-end tests: a worker and oscillators as real processes on the real broker."""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from futures.client import TimerClient
from ktimers.broker import free_port
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, TimerEvent, decode_events, header_value
from tests.processes import Service, SpawnFn

WORKER_READY = "timer table ready"
OSCILLATOR_READY = "oscillator started"


@dataclass
class Callback:
    """A callback record as a receiver sees it."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    received_ms: int
    partition: int = -1
    offset: int = -1

    @property
    def timer_id(self) -> str:
        return (header_value(self.headers, H_ID) or b"").decode()

    @property
    def due_ms(self) -> int:
        return int(header_value(self.headers, H_DUE_MS) or 0)

    @property
    def fired_ms(self) -> int:
        return int(header_value(self.headers, H_FIRED_MS) or 0)


class TopicReader:
    """Reads every partition of a topic from the beginning, without a consumer group.

    Group joins are slow on the embedded broker; direct assignment is immediate.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.records: list[Callback] = []

    def poll(self, duration_s: float) -> list[Callback]:
        """Read for ``duration_s``; return what arrived."""
        new: list[Callback] = []
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for msg in self._consumer.consume(10_000, timeout=0.05):
                if msg.error() is None:
                    new.append(self._callback(msg))
        self.records.extend(new)
        return new

    def read_until(self, done: Callable[[list[Callback]], bool], timeout_s: float) -> list[Callback]:
        deadline = time.monotonic() + timeout_s
        while not done(self.records) and time.monotonic() < deadline:
            self.poll(0.2)
        return self.records

    @staticmethod
    def _callback(msg: Message) -> Callback:
        return Callback(
            msg.key(),
            msg.value(),
            list(msg.headers() or []),
            time.time_ns() // 1_000_000,
            msg.partition() or 0,
            msg.offset() or 0,
        )

    def close(self) -> None:
        self._consumer.close()


@dataclass
class Stack:
    """One service instance: its env, worker and oscillators, all on the test broker."""

    env: dict[str, str]
    spawn: SpawnFn
    data_dir: Path
    web_port: int = field(default_factory=free_port)
    worker: Service | None = None
    oscillators: list[Service] = field(default_factory=list)
    readers: list[TopicReader] = field(default_factory=list)

    @property
    def common(self) -> CommonConfig:
        return CommonConfig.from_env(self.env)

    @property
    def bootstrap(self) -> str:
        return self.env["KAFKA_BOOTSTRAP_SERVERS"]

    def worker_env(self) -> dict[str, str]:
        return {**self.env, "TIMERS_DATA_DIR": str(self.data_dir), "TIMERS_WEB_PORT": str(self.web_port)}

    def start_worker(self, wait: bool = True) -> Service:
        if self.worker is None:
            self.worker = self.spawn("worker", ["-m", "futures.worker.main"], self.worker_env(), start=False)
        self.worker.env = self.worker_env()
        self.worker.start()
        if wait:
            self.worker.wait_for_output(WORKER_READY, timeout_s=60)
        return self.worker

    def start_oscillator(self) -> Service:
        env = {
            **self.env,
            "TIMERS_OSC_HEALTH_PORT": str(free_port()),
            "TIMERS_OSC_INSTANCE": f"osc-{len(self.oscillators)}",
        }
        osc = self.spawn(f"oscillator{len(self.oscillators)}", ["-m", "oscillator.main"], env)
        osc.wait_for_output(OSCILLATOR_READY, timeout_s=30)
        self.oscillators.append(osc)
        return osc

    def client(self) -> TimerClient:
        return TimerClient(self.common)

    def callback_topic(self, name: str, partitions: int = 4) -> TopicReader:
        """Create a callback topic (allowed by the test allow-list) and a reader for it."""
        topic = f"cb-{name}-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
        reader = TopicReader(self.bootstrap, topic, partitions)
        self.readers.append(reader)
        return reader

    def reader(self, topic: str) -> TopicReader:
        reader = TopicReader(self.bootstrap, topic, self.common.topics.partitions)
        self.readers.append(reader)
        return reader

    def events(self) -> list[TimerEvent]:
        """Every record on `timer-events` so far, decoded."""
        reader = self.reader(self.common.topics.events)
        reader.poll(1.0)
        return [event for r in reader.records for event in decode_events(r.value, r.headers)]

    def metrics(self) -> dict[str, float]:
        """The worker's Prometheus samples, by name with labels."""
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/metrics", timeout=5).read()  # noqa: S310
        samples = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def metric_sum(self, prefix: str) -> float:
        return sum(v for k, v in self.metrics().items() if k == prefix or k.startswith(prefix + "{"))

    def wait_for_metric(self, prefix: str, predicate: Callable[[float], bool], timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.metric_sum(prefix)
                if predicate(value):
                    return value
            except OSError:
                value = float("nan")
            if time.monotonic() > deadline:
                raise AssertionError(f"{prefix} = {value} after {timeout_s}s")
            time.sleep(0.2)

    def close(self) -> None:
        for reader in self.readers:
            reader.close()


#: Limits the shared test stack runs with, so bad-input tests can trip them.
STACK_LIMITS = {
    "TIMERS_ALLOWED_CALLBACK_TOPICS": "cb-*",
    "TIMERS_MAX_PAYLOAD_BYTES": "10000",
    "TIMERS_MAX_DUE_AHEAD_S": str(500 * 86400),
}


def fresh_env(
    broker_env: dict[str, str], *, partitions: int = 4, settings: Mapping[str, str] = STACK_LIMITS
) -> dict[str, str]:
    """A service instance on the test broker: its own topics (created) and app id, plus ``settings``."""
    suffix = uuid.uuid4().hex[:8]
    env = {
        **broker_env,
        **settings,
        "TIMERS_TOPIC_OSCILLATOR": f"oscillator-{suffix}",
        "TIMERS_TOPIC_REQUEST": f"timer-request-{suffix}",
        "TIMERS_TOPIC_EVENTS": f"timer-events-{suffix}",
        "TIMERS_TOPIC_DLQ": f"timer-request-dlq-{suffix}",
        "TIMERS_PARTITIONS": str(partitions),
        "TIMERS_APP_ID": f"timers-{suffix}",
    }
    create_topics(CommonConfig.from_env(env))
    return env


@pytest.fixture
def stack(broker_env: dict[str, str], spawn: SpawnFn, tmp_path: Path) -> Iterator[Stack]:
    """A fresh service instance (own topics); nothing started yet."""
    s = Stack(env=fresh_env(broker_env), spawn=spawn, data_dir=tmp_path / "worker-data")
    yield s
    s.close()


@pytest.fixture
def running(stack: Stack) -> Stack:
    """A fresh instance with one worker and one oscillator running."""
    stack.start_worker()
    stack.start_oscillator()
    return stack
