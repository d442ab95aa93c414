"""Requests written by a transactional producer: every timer fires once, the worker's committed
offset reaches the end of the partition, and the markers' holes are never read back.

The embedded broker shows aborted records even to ``read_committed`` consumers, so that
aborted requests never apply is tested on a simulated log (tests/worker/test_transport.py,
tests/worker/test_faust_adapter.py), not here.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from futures.client.records import build_schedule
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

TRANSACTIONS = 50
PER_TRANSACTION = 3
PARTITION = 1


def committed_offset(stack: Stack, topic: str, partition: int) -> int:
    """The worker's committed offset of ``topic[partition]`` (its consumer group is the app id)."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.env["TIMERS_APP_ID"]})
    try:
        [tp] = consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def test_requests_of_committed_transactions_fire_once_and_the_committed_offset_reaches_the_end(
    running: Stack,
) -> None:
    reader = running.callback_topic("txn")
    common = running.common
    topic = common.topics.request
    offsets: list[int] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        offsets.append(msg.offset() or 0)

    producer = Producer(
        {"bootstrap.servers": running.bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(10)
    ids: list[str] = []
    now = time.time()
    for txn in range(TRANSACTIONS):
        producer.begin_transaction()
        for i in range(PER_TRANSACTION):
            record, handle = build_schedule(
                common, reader.topic, f"k{txn}-{i}", f"p{txn}-{i}", now=now, delay=4.0
            )
            producer.produce(
                topic, record.value, key=record.key, headers=record.headers, partition=PARTITION,
                on_delivery=delivered,
            )  # fmt: skip
            ids.append(handle.id)
        producer.commit_transaction(10)
    data = sorted(offsets)
    end = data[-1] + 2  # the last transaction's commit marker takes the offset after its records
    assert len(data) == TRANSACTIONS * PER_TRANSACTION and end == len(data) + TRANSACTIONS, (
        "each transaction's marker takes an offset"
    )

    reader.read_until(lambda r: len(r) >= len(ids), timeout_s=40)
    reader.poll(1.0)  # anything fired twice would show up now
    counts = Counter(c.timer_id for c in reader.records)
    assert set(counts) == set(ids), f"{len(set(ids) - set(counts))} of {len(ids)} timers never fired"
    assert max(counts.values()) == 1, "a timer fired twice"

    # Faust commits every 2.8 s. Holding each marker's offset, the committed offset would move one
    # transaction per commit (50 commits, minutes) while the ack books grew; at the end, they hold
    # nothing below it.
    deadline = time.monotonic() + 15
    while (committed := committed_offset(running, topic, PARTITION)) < end and time.monotonic() < deadline:
        time.sleep(0.5)
    assert committed == end, f"the worker's committed offset is {committed}, the partition ends at {end}"

    metrics = running.metrics()
    assert metrics.get('timers_request_gaps_total{outcome="read-back"}') == 0, "a marker's hole was read back"
    assert metrics.get('timers_request_gaps_total{outcome="no-request"}', 0) >= TRANSACTIONS - 1
    assert metrics.get("timers_requests_read_back_total") == 0
