"""Fixtures for end-to-end tests: a worker and oscillators as real processes on the real broker.

The processes are started by :mod:`tools.stack`, as ``make run`` and the benchmarks start them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from futures.client import TimerClient
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, TimerEvent, decode_events, header_value
from tests.processes import SpawnFn
from tools import stack as stack_helper
from tools.stack import OSCILLATOR_READY, WORKER_READY, instance_env

__all__ = ["OSCILLATOR_READY", "WORKER_READY", "Callback", "Stack", "TopicReader", "fresh_env"]


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
class Stack(stack_helper.Stack):
    """One service instance on the test broker (:class:`tools.stack.Stack`), with readers of its topics."""

    readers: list[TopicReader] = field(default_factory=list)

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
    env = {**broker_env, **settings, **instance_env(partitions=partitions)}
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
