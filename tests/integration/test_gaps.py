"""The gap reader reads exactly a range of request offsets back from the broker."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer

from futures.gaps import KafkaGapReader
from ktimers.config import CommonConfig

pytestmark = pytest.mark.integration


def test_reads_exactly_the_missing_offsets(timers_env):
    common = CommonConfig.from_env(timers_env)
    topic = common.topics.request
    producer = Producer({"bootstrap.servers": common.kafka.bootstrap_servers})
    for i in range(6):
        producer.produce(topic, f"v{i}".encode(), key=f"k{i}".encode(), partition=2, headers=[("n", str(i))])
        producer.flush()  # one record per batch: offsets 0..5
    reader = KafkaGapReader(common.kafka)
    try:
        records = asyncio.run(reader.read(topic, 2, 1, 4))
        again = asyncio.run(reader.read(topic, 2, 4, 6))
    finally:
        reader.close()
    assert [(r.offset, r.key, r.value) for r in records] == [
        (1, b"k1", b"v1"),
        (2, b"k2", b"v2"),
        (3, b"k3", b"v3"),
    ]
    assert records[0].headers == (("n", b"1"),)
    assert records[0].timestamp_ms > 0
    assert [r.offset for r in again] == [4, 5]
