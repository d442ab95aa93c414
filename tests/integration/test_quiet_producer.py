"""The changelog's quiet producer on the broker: a write is delivered once the producer holds
nothing more, and only its failures are reported."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from futures.worker.kafka import Deliveries, KafkaWriter, producer_config
from ktimers.config import CommonConfig
from ktimers.errors import DeliveryError

pytestmark = pytest.mark.integration


def _read(common: CommonConfig, topic: str, partition: int, count: int) -> list[tuple[bytes, bytes | None]]:
    consumer = Consumer(
        {**common.kafka.librdkafka(), "group.id": f"{topic}-reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    records: list[tuple[bytes, bytes | None]] = []
    try:
        for _ in range(100):
            for message in consumer.consume(count - len(records), timeout=0.5):
                if message.error() is None:
                    records.append((message.key(), message.value()))
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records


def test_a_write_through_the_quiet_producer_lands_whole_and_in_order(
    common: CommonConfig, unique: Callable[[str], str]
) -> None:
    topic = unique("changelog")
    admin = AdminClient(common.kafka.librdkafka())
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
    quiet = Producer(producer_config(common.kafka, quiet=True))
    writer = KafkaWriter(Producer(producer_config(common.kafka)), quiet=quiet)
    records: list[tuple[bytes, bytes | None]] = [(f"t{i}".encode(), f"v{i}".encode()) for i in range(5000)]
    records[10] = (b"t3", None)  # a tombstone among the puts
    deliveries = Deliveries()
    writer.produce_many(topic, 1, records, deliveries)
    asyncio.run(asyncio.wait_for(writer.delivered(deliveries), timeout=30))
    deliveries.raise_first("changelog")
    assert len(quiet) == 0
    assert _read(common, topic, 1, len(records)) == records
    writer.close()


def test_a_quiet_record_that_fails_fails_its_write(
    common: CommonConfig, unique: Callable[[str], str]
) -> None:
    config = producer_config(common.kafka, quiet=True)
    config["topic.metadata.propagation.max.ms"] = 1000  # how long librdkafka waits for a topic to appear
    writer = KafkaWriter(Producer(producer_config(common.kafka)), quiet=Producer(config))
    deliveries = Deliveries()
    writer.produce_many(unique("no-such-changelog"), 0, [(b"k", b"v")], deliveries)
    asyncio.run(asyncio.wait_for(writer.delivered(deliveries), timeout=20))
    with pytest.raises(DeliveryError, match="^1 changelog record"):
        deliveries.raise_first("changelog")
    writer.close()
