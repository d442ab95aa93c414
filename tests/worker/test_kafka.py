"""The worker's bulk writer: every record's delivery report counts."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError

from futures.worker.kafka import MESSAGE_TIMEOUT_MS, Deliveries, KafkaWriter, producer_config
from ktimers.config import KafkaConfig
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


def test_a_changelog_write_waits_until_the_quiet_producer_holds_nothing_and_reports_only_failures():
    main, quiet = FakeProducer(), FakeProducer(only_errors=True)
    quiet.fail = lambda topic: KafkaError(KafkaError._MSG_TIMED_OUT) if topic == "slow" else None
    writer = KafkaWriter(main, quiet=quiet)
    deliveries = Deliveries()
    writer.produce_many("changelog", 2, [(b"a", b"1"), (b"b", None)], deliveries)
    writer.produce_many("slow", 2, [(b"c", b"3")], deliveries)
    assert main.sent == []  # the changelog's bulk goes through the quiet producer only
    quiet.hold = True  # the broker has not answered yet

    async def write() -> None:
        waiting = asyncio.ensure_future(writer.delivered(deliveries))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # three records are still on their way
        quiet.hold = False
        await asyncio.wait_for(waiting, timeout=1)

    asyncio.run(write())
    assert [(s.topic, s.partition, s.key, s.delivered) for s in quiet.sent] == [
        ("changelog", 2, b"a", True),
        ("changelog", 2, b"b", True),
        ("slow", 2, b"c", False),
    ]
    assert [msg.key() for _, msg in deliveries.failed if msg is not None] == [b"c"]
    with pytest.raises(DeliveryError, match="^1 changelog record"):
        deliveries.raise_first("changelog")


def test_a_quiet_record_refused_by_produce_fails_its_write():
    quiet = FakeProducer(only_errors=True)
    quiet.refuse = lambda topic: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    writer = KafkaWriter(FakeProducer(), quiet=quiet)
    deliveries = Deliveries()
    writer.produce_many("changelog", 0, [(b"big", b"v")], deliveries)
    asyncio.run(writer.delivered(deliveries))
    [(error, _)] = deliveries.failed
    assert error.code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_the_service_topics_records_wait_out_an_outage_the_callbacks_give_up():
    kafka = KafkaConfig()
    # librdkafka's 0: retried until delivered, so a durable write waits for the brokers instead
    # of failing (which stopped the worker after 30 s of outage).
    assert producer_config(kafka)["message.timeout.ms"] == 0
    assert producer_config(kafka, quiet=True)["message.timeout.ms"] == 0
    assert producer_config(kafka, callbacks=True)["message.timeout.ms"] == MESSAGE_TIMEOUT_MS


def test_callbacks_go_through_the_callbacks_producer_the_service_topics_records_do_not():
    main, quiet, callbacks = FakeProducer(), FakeProducer(only_errors=True), FakeProducer()
    writer = KafkaWriter(main, quiet=quiet, callbacks=callbacks)
    deliveries = Deliveries()
    writer.queue("cb-orders", b"payload", b"k", 0, deliveries.on_delivery)
    deliveries.pending += 1
    writer.produce_callback("cb-orders", b"k2", b"payload", deliveries=deliveries)
    writer.produce("timer-events", b"e", b"event", deliveries=deliveries)
    writer.produce_many("changelog", 0, [(b"t", b"timer")], deliveries)

    asyncio.run(writer.delivered(deliveries))

    assert [s.topic for s in callbacks.sent] == ["cb-orders", "cb-orders"]
    assert [s.topic for s in main.sent] == ["timer-events"]
    assert [s.topic for s in quiet.sent] == ["changelog"]
    assert deliveries.pending == 0 and deliveries.failed == []
