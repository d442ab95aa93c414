"""The worker's bulk writer: every record's delivery report counts."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError

from futures.worker.kafka import Deliveries, KafkaWriter
from ktimers.errors import DeliveryError
from tests.worker.fakes import FakeProducer


def test_each_failed_record_is_counted_when_no_index_is_given():
    producer = FakeProducer(fail=lambda topic: KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    writer = KafkaWriter(producer)
    deliveries = Deliveries()
    for key in (b"a", b"b", b"c"):
        writer.produce("gone", key, b"v", deliveries=deliveries)
    asyncio.run(writer.delivered(deliveries))
    # Each with the record its report names.
    assert [msg.key() for _, msg in deliveries.failed if msg is not None] == [b"a", b"b", b"c"]
    with pytest.raises(DeliveryError, match="^3 changelog record"):
        deliveries.raise_first("changelog")


def test_a_record_refused_by_produce_is_reported_under_its_index():
    producer = FakeProducer()
    producer.refuse = lambda topic: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if topic == "big" else None
    writer = KafkaWriter(producer)
    deliveries = Deliveries()
    writer.produce("ok", b"a", b"v", deliveries=deliveries, index=7)
    writer.produce("big", b"b", b"v", deliveries=deliveries, index=8)
    asyncio.run(writer.delivered(deliveries))
    assert list(deliveries.errors) == [8]
    assert deliveries.errors[8].code() == KafkaError.MSG_SIZE_TOO_LARGE
