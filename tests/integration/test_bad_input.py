"""Bad input is dead-lettered with its reason; the worker keeps going and nothing valid is lost."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from futures.worker.kafka import Deliveries, KafkaWriter, is_permanent, producer_config
from futures.worker.table import PartitionTimers
from ktimers.wire import (
    H_ERROR,
    H_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    KIND_HEADER,
    Future,
    header_value,
)
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


def test_each_bad_request_lands_in_the_dlq_with_its_reason(running: Stack) -> None:
    reader = running.callback_topic("valid")
    request_topic = running.common.topics.request
    due_ms = int(time.time() * 1000) + 2000

    def future(topic: str = reader.topic, payload: bytes = b"ok", due: int | None = due_ms) -> bytes:
        f = Future(callBackTopic=topic, callBackKey="k", callBack=payload)
        if due is not None:
            f.due_ms = due
        return f.SerializeToString()

    bad = {
        "undecodable": (b"bad-1", b"\xff\xfe not protobuf", []),
        "bad-due-time": (b"not-a-second", future(due=None), []),
        "missing-callback-topic": (b"bad-3", future(topic=""), []),
        "callback-topic-not-allowed": (b"bad-4", future(topic="payments"), []),  # not in the allow-list
        "invalid-callback-topic": (b"bad-5", future(topic="no spaces allowed"), []),
        "payload-too-large": (b"bad-6", future(payload=b"x" * 20_000), []),
        "due-too-far": (b"bad-7", future(due=due_ms + 600 * 86400 * 1000), []),
        "unknown-kind": (b"bad-8", future(), [(KIND_HEADER, b"snooze")]),
    }
    own_topic = (b"bad-9", future(topic=request_topic), [])  # a timer must not write the service's topics
    producer = Producer({"bootstrap.servers": running.bootstrap})
    for i in range(10):
        producer.produce(request_topic, future(payload=f"valid-{i}".encode()), key=f"valid-{i}".encode())
        if i < len(bad):
            key, value, headers = list(bad.values())[i]
            producer.produce(request_topic, value, key=key, headers=headers)
    producer.produce(request_topic, own_topic[1], key=own_topic[0])
    assert producer.flush(10) == 0

    dlq = running.reader(running.common.topics.dlq)
    dead = dlq.read_until(lambda r: len(r) >= len(bad) + 1, timeout_s=20)
    reasons = {header_value(d.headers, H_REASON): d for d in dead}
    assert set(reasons) == {r.encode() for r in bad} | {b"callback-topic-not-allowed"}
    for reason, (key, value, _) in bad.items():
        record = reasons[reason.encode()]
        if reason != "callback-topic-not-allowed":
            assert (record.key, record.value) == (key, value), reason  # the record as it was sent
        assert header_value(record.headers, H_SOURCE_TOPIC) == request_topic.encode()
        assert header_value(record.headers, H_SOURCE_PARTITION) is not None
        assert int(header_value(record.headers, H_SOURCE_OFFSET) or b"-1") >= 0
    # The valid timers around them all fired.
    callbacks = reader.read_until(lambda r: len(r) >= 10, timeout_s=20)
    assert sorted(c.value for c in callbacks) == sorted(f"valid-{i}".encode() for i in range(10))
    assert running.worker is not None and running.worker.running
    assert running.metric_sum("timers_rejected_total") == len(bad) + 1


def test_a_timer_due_in_400_days_is_held(running: Stack) -> None:
    with running.client() as client:
        handle = client.schedule("cb-far-future", "k", "see you next year", delay=400 * 86400)
    running.wait_for_metric("timers_pending", lambda v: v == 1, timeout_s=20)
    assert running.worker is not None
    assert running.worker.stop() == 0
    held = []
    for path in sorted((running.data_dir / "timers").glob("partition-*.db")):
        table = PartitionTimers(path)
        held += [(t.timer_id, t.due_ms) for t in table.iter_pending()]
        table.close()
    assert held == [(handle.id, handle.due_ms)]


def test_a_timer_to_a_topic_that_does_not_exist_is_dead_lettered_and_the_topic_never_created(
    running: Stack,
) -> None:
    # The embedded broker creates a topic whenever metadata names it, as Kafka does by default.
    reader = running.callback_topic("exists")
    missing = [f"cb-missing-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]  # admitted by the allow-list
    with running.client() as client:
        lost = {client.schedule(topic, "k", b"nowhere", delay=1.0).id: topic for topic in missing}
        client.schedule(reader.topic, "k", b"here", delay=1.0)
    dlq = running.reader(running.common.topics.dlq)
    letters = dlq.read_until(lambda r: len(r) >= len(lost), timeout_s=20)
    assert {(d.key or b"").decode(): header_value(d.headers, H_REASON) for d in letters} == {
        timer_id: b"callback-undeliverable" for timer_id in lost
    }
    for letter in letters:
        topic = lost[(letter.key or b"").decode()]
        assert (header_value(letter.headers, H_ERROR) or b"").startswith(topic.encode())
        assert Future.FromString(letter.value or b"").callBackTopic == topic  # resendable as it was
    assert [c.value for c in reader.read_until(lambda r: len(r) >= 1, timeout_s=10)] == [b"here"]
    admin = AdminClient({"bootstrap.servers": running.bootstrap})
    topics = admin.list_topics(timeout=5).topics  # every topic: a listing creates none
    assert not set(missing) & set(topics), "the worker created a callback topic a request named"


def test_the_workers_producer_never_creates_a_topic_by_writing_to_it(running: Stack) -> None:
    # A callback topic deleted after the worker listed it: its next callback must fail (and be
    # dead-lettered), not create the topic again on a broker that creates topics on demand.
    config = producer_config(running.common.kafka)
    config["topic.metadata.propagation.max.ms"] = 1000  # how long librdkafka waits for a topic to appear
    writer = KafkaWriter(Producer(config))
    topic = f"cb-deleted-{uuid.uuid4().hex[:8]}"
    deliveries = Deliveries()
    writer.produce(topic, b"k", b"v", deliveries=deliveries, index=0)
    asyncio.run(asyncio.wait_for(writer.delivered(deliveries), timeout=20))
    [error] = deliveries.errors.values()
    assert is_permanent(error), error.str()  # dead-lettered, not retried
    topics = AdminClient({"bootstrap.servers": running.bootstrap}).list_topics(timeout=5).topics
    assert topic not in topics, "the worker's producer created the topic it wrote to"
