"""A consumed Kafka record, independent of the framework that consumed it."""

from __future__ import annotations

from dataclasses import dataclass

from ktimers.wire import KafkaHeaders


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and the worker
# builds one of these for every record it consumes (docs/PERFORMANCE.md#accepting-a-timer).
@dataclass(slots=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: KafkaHeaders = ()
    #: The record's timestamp (epoch ms, as Kafka stores it); -1 when unknown.
    timestamp_ms: int = -1

    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"
