"""Reading back request records the stream skipped.

Faust acks — without delivering — records its stream fetched while flow
control was off or under an older consumer generation (a rebalance in
progress), and may then read on past them. For a timer service a request
that is never applied is a lost timer. The engine notices the hole (a
record's offset is more than one past the last applied offset of its
partition; plain producers never leave holes) and reads the missing range
here, directly, before it goes on.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast

from confluent_kafka import Consumer, TopicPartition

from futures.records import SourceRecord
from ktimers.config import KafkaConfig
from ktimers.wire import KafkaHeaders

#: How long one read of a hole may take before the engine goes on without it (s).
READ_TIMEOUT_S = 15.0


class GapReader(Protocol):
    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """The records of ``topic[partition]`` with ``start <= offset < end``."""
        ...


class KafkaGapReader:
    """A consumer that is assigned, never subscribed: no group, no commits."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._consumer = Consumer(
            {
                **kafka.librdkafka(),
                "group.id": "kafka-timers-gap-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 50,
            }
        )

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._read, topic, partition, start, end)

    def _read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        self._consumer.assign([TopicPartition(topic, partition, start)])
        found: list[SourceRecord] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                msg = self._consumer.poll(0.2)
                if msg is None or msg.error():
                    continue
                offset = msg.offset() or 0
                if offset >= end:
                    break  # what is left of the hole were transaction markers
                found.append(
                    SourceRecord(
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        key=msg.key(),
                        value=msg.value(),
                        headers=tuple(cast(KafkaHeaders, msg.headers() or ())),
                        timestamp_ms=msg.timestamp()[1],
                    )
                )
                if offset == end - 1:
                    break
        finally:
            self._consumer.unassign()
        return found

    def close(self) -> None:
        self._consumer.close()
