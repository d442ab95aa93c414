"""The gap reader reads exactly a range of request offsets back from the broker, or says it could not."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import KafkaError, Message, Producer

from futures.worker.gaps import GapReadError, KafkaGapReader
from ktimers.config import CommonConfig
from tests.raw_headers import produce_raw

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


def test_a_hole_it_cannot_read_to_its_end_raises_instead_of_returning_part_of_it(timers_env):
    common = CommonConfig.from_env(timers_env)
    topic = common.topics.request
    producer = Producer({"bootstrap.servers": common.kafka.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, f"v{i}".encode(), partition=1)
    producer.flush()  # offsets 0..2; the range asks for 1..7
    reader = KafkaGapReader(common.kafka, timeout_s=1.0, attempts=2)
    try:
        started = time.monotonic()
        with pytest.raises(GapReadError, match=r"offsets 1\.\.7 .*2 record\(s\) read.* restart"):
            asyncio.run(reader.read(topic, 1, 1, 8))
        assert time.monotonic() - started < 10, "the retries are bounded"
        # The reader is still usable for the next hole.
        assert [r.value for r in asyncio.run(reader.read(topic, 1, 0, 2))] == [b"v0", b"v1"]
    finally:
        reader.close()


def test_offsets_of_transaction_markers_are_not_waited_for(timers_env):
    common = CommonConfig.from_env(timers_env)
    topic = common.topics.request
    bootstrap = common.kafka.bootstrap_servers
    offsets: list[int] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        offsets.append(msg.offset() or 0)

    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    transactional.init_transactions(10)
    for txn in range(2):
        transactional.begin_transaction()
        for i in range(2):
            transactional.produce(topic, f"t{txn}-{i}".encode(), partition=3, on_delivery=delivered)
        transactional.commit_transaction(10)  # a commit marker takes the next offset
    data = sorted(offsets)
    marker_after_last = data[-1] + 1
    assert len(data) == 4 and data != list(range(4)), "the first commit marker sits between the records"

    reader = KafkaGapReader(common.kafka, timeout_s=5.0, attempts=1)
    try:
        # The hole ends on a commit marker and nothing follows it (yet): no record at its last offset.
        started = time.monotonic()
        tail = asyncio.run(reader.read(topic, 3, data[2], marker_after_last + 1))
        assert time.monotonic() - started < 5.0, "it waited for the marker's offset"
        assert [(r.offset, r.value) for r in tail] == [(data[2], b"t1-0"), (data[3], b"t1-1")]

        plain = Producer({"bootstrap.servers": bootstrap})
        plain.produce(topic, b"after", partition=3, on_delivery=delivered)
        plain.flush()
        after = offsets[-1]
        whole = asyncio.run(reader.read(topic, 3, 0, after))
    finally:
        reader.close()
    assert [(r.offset, r.value) for r in whole] == list(
        zip(data, [b"t0-0", b"t0-1", b"t1-0", b"t1-1"], strict=True)
    )


def test_a_record_whose_header_key_is_not_utf8_is_read_back_without_its_headers(timers_env):
    common = CommonConfig.from_env(timers_env)
    topic = common.topics.request
    bootstrap = common.kafka.bootstrap_servers
    produce_raw(bootstrap, topic, [(0, b"k0", b"v0", []), (0, b"k1", b"v1", [(b"\xff\xfe", b"x")])])
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"v2", key=b"k2", partition=0)
    producer.flush()
    reader = KafkaGapReader(common.kafka, timeout_s=5.0, attempts=1)
    try:
        records = asyncio.run(reader.read(topic, 0, 0, 3))
    finally:
        reader.close()
    assert [(r.offset, r.value, r.headers) for r in records] == [
        (0, b"v0", ()),
        (1, b"v1", ()),  # its headers could not be read: judged without them, not a stopped worker
        (2, b"v2", ()),
    ]
