"""Test doubles for the oscillator: a settable clock and a broker-less producer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ktimers.wire import Tick


class FakeClock:
    """Epoch seconds that only move when a test moves them."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Record:
    topic: str
    key: bytes
    value: bytes
    partition: int
    on_delivery: Any

    @property
    def tick(self) -> Tick:
        return Tick.FromString(self.value)


@dataclass
class FakeProducer:
    """Records what was produced; delivery reports are served when the test says so."""

    records: list[Record] = field(default_factory=list)
    pending: list[Record] = field(default_factory=list)
    produce_error: BaseException | None = None
    fail_partitions: set[int] = field(default_factory=set)
    polls: int = 0

    def produce(self, topic: str, *, value: bytes, key: bytes, partition: int, on_delivery: Any) -> None:
        if self.produce_error is not None and partition in (self.fail_partitions or {partition}):
            raise self.produce_error
        record = Record(topic, key, value, partition, on_delivery)
        self.records.append(record)
        self.pending.append(record)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float) -> int:
        return len(self.pending)

    def deliver(self, error: KafkaError | None = None) -> None:
        """Serve the delivery report of every pending record, with ``error`` (None = success)."""
        pending, self.pending = self.pending, []
        for record in pending:
            record.on_delivery(error, None)


def fatal_error(reason: str = "producer fenced") -> KafkaError:
    return KafkaError(KafkaError._FATAL, reason, fatal=True)


def fatal_exception(reason: str = "producer fenced") -> KafkaException:
    return KafkaException(fatal_error(reason))
