"""What every part needs of a confluent-kafka ``Producer``: one protocol, so tests pass fakes.

The oscillator, the worker, the client and the admin API all produce through
librdkafka; they use different subsets of this, and a fake implements the
subset its test exercises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import ClusterMetadata

DeliveryCallback = Callable[[KafkaError | None, Message], None]
RecordHeaders = list[tuple[str, str | bytes | None]]

#: ``partition`` of ``produce`` when the producer's partitioner chooses (librdkafka's UA).
ANY_PARTITION = -1


class ProducerLike(Protocol):
    """The calls of ``confluent_kafka.Producer`` that kafka-timers makes.

    ``produce`` takes its arguments positionally too, in confluent-kafka's order: the delivery
    callback fifth, as ``callback`` (``on_delivery`` is its alias), and ``timestamp`` 0 for the
    time of producing. The worker's loops that produce a record per timer pass them so: parsing
    keywords costs confluent-kafka more than queueing the record (:mod:`futures.worker.kafka`).
    """

    def produce(
        self,
        topic: str,
        value: str | bytes | None = ...,
        key: str | bytes | None = ...,
        partition: int = ...,
        callback: DeliveryCallback | None = ...,
        on_delivery: DeliveryCallback | None = ...,
        timestamp: int = ...,
        headers: RecordHeaders | None = ...,
    ) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> ClusterMetadata: ...

    def __len__(self) -> int: ...
