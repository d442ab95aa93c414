"""``TimerClient(schema_registry=...)``: requests framed as Schema Registry serializers frame them."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from futures.client import AsyncTimerClient, TimerClient
from futures.ingress.framing import unframe
from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, RequestParser, Schedule
from ktimers.errors import DeliveryError
from ktimers.wire import Cancel
from tests.client.test_client_bulk import COMMON, NOW, FakeProducer, specs

LIMITS = ParseLimits(topics=COMMON.topics)


def parsed(producer: FakeProducer) -> list[object]:
    """What the worker makes of every record the client sent."""
    parser = RequestParser(LIMITS, int(NOW * 1000))
    return [
        request
        for offset, sent in enumerate(producer.sent)
        for request in parser.parse(SourceRecord(sent.topic, 0, offset, sent.key, sent.value, sent.headers))
    ]


def test_the_client_frames_every_request_as_the_serializer_would():
    registry = SchemaRegistryClient.new_client({"url": "mock://client-framing"})
    producer = FakeProducer()
    with TimerClient(COMMON, producer=producer, clock=lambda: NOW, schema_registry=registry) as client:
        handle = client.schedule("orders", "o-1", b"pay", delay=30, id="t-1")
        client.cancel(handle)
        client.schedule_many(specs(5))
    values = [sent.value for sent in producer.sent]
    assert all(unframe(v).schema_id == 1 for v in values)  # type: ignore[union-attr]
    # The serializer itself, on the request topic: the same bytes for the cancel.
    serializer = ProtobufSerializer(Cancel, registry, {})
    assert values[1] == serializer(Cancel(id="t-1"), SerializationContext("req-topic", MessageField.VALUE))
    requests = parsed(producer)
    assert [type(r) for r in requests] == [Schedule, CancelRequest, *[Schedule] * 5]
    assert requests[0].timer_id == "t-1" and requests[0].due_ms == round((NOW + 30) * 1000)  # type: ignore[attr-defined]
    # Registered once, under the request topic's subject.
    assert registry.get_subjects() == ["req-topic-value"]


def test_the_async_client_asks_the_registry_off_the_event_loop():
    producer = FakeProducer()

    async def run() -> None:
        async with AsyncTimerClient(
            COMMON, producer=producer, clock=lambda: NOW, schema_registry="mock://client-framing-async"
        ) as client:
            await client.schedule("orders", "o-1", b"pay", delay=30, id="t-1")
            await client.cancel("t-1")

    asyncio.run(run())
    assert [type(r) for r in parsed(producer)] == [Schedule, CancelRequest]


def test_a_registry_that_gives_no_schema_id_is_a_clear_error_and_nothing_is_sent():
    producer = FakeProducer()
    client = TimerClient(
        COMMON,
        producer=producer,
        schema_registry="mock://client-framing-empty",
        schema_serializer_config={"auto.register.schemas": False, "use.latest.version": True},
    )
    with pytest.raises(DeliveryError, match="Schema Registry gave no schema id for Future on 'req-topic'"):
        client.schedule("orders", "o-1", b"pay", delay=30)
    assert producer.sent == []
