"""Bulk scheduling (``schedule_many``) and ``send_later``, without a broker."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futures.client import AsyncTimerClient, TimerClient, TimerSpec, build_batches
from futures.client.partitioner import crc32_partition, murmur2, murmur2_partition, partitioner_for
from futures.client.records import batch_values
from ktimers.config import CommonConfig, TopicsConfig
from ktimers.errors import ConfigError, TimersError
from ktimers.wire import KIND_BATCH, KIND_HEADER, Future, FutureBatch

COMMON = CommonConfig(topics=TopicsConfig(request="req-topic"))
NOW = 1_800_000_000.25


@dataclass
class Sent:
    topic: str
    key: bytes | None
    value: bytes
    headers: list
    partition: int | None


@dataclass
class FakeProducer:
    """Records what is produced (with the partition asked for) and knows the topic's partitions."""

    partitions: int = 4
    sent: list[Sent] = field(default_factory=list)
    metadata_calls: int = 0
    _queue: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(
        self,
        topic,
        value=None,
        key=None,
        partition=-1,
        callback=None,
        on_delivery=None,
        timestamp=0,
        headers=None,
    ):
        on_delivery = on_delivery or callback
        with self._lock:
            self.sent.append(
                Sent(topic, key, value, list(headers or []), None if partition < 0 else partition)
            )
            self._queue.append(on_delivery)

    def poll(self, timeout=-1):
        with self._lock:
            queue, self._queue = self._queue, []
        for callback in queue:
            callback(None, object())
        return len(queue)

    def flush(self, timeout=-1):
        self.poll()
        return 0

    def list_topics(self, topic=None, timeout=-1):
        self.metadata_calls += 1
        topics = {"req-topic": SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))}
        return SimpleNamespace(topics=topics if self.partitions else {})


def specs(n: int, **kw) -> list[TimerSpec]:
    return [TimerSpec("orders", f"k{i}", f"v{i}", delay=10 + i, id=f"id-{i}", **kw) for i in range(n)]


def batches(producer: FakeProducer) -> list[tuple[int | None, list[Future]]]:
    return [(s.partition, list(FutureBatch.FromString(s.value).futures)) for s in producer.sent]


def test_timers_are_batched_by_the_partition_their_id_maps_to():
    producer = FakeProducer(partitions=4)
    with TimerClient(COMMON, producer=producer, clock=lambda: NOW) as client:
        handles = client.schedule_many(specs(50))
    assert [h.id for h in handles] == [f"id-{i}" for i in range(50)]
    assert all(s.topic == "req-topic" and s.headers == [(KIND_HEADER, KIND_BATCH)] for s in producer.sent)
    seen = []
    for partition, futures in batches(producer):
        for future in futures:
            # The partition a single request keyed by the id would land in (librdkafka's default).
            assert partition == crc32_partition(future.id.encode(), 4)
            seen.append(future.id)
    assert sorted(seen) == sorted(h.id for h in handles)
    assert len(producer.sent) == len({crc32_partition(h.record_key, 4) for h in handles})
    first = next(f for _, fs in batches(producer) for f in fs if f.id == "id-3")
    assert (first.callBackTopic, first.callBackKey, first.callBack) == ("orders", "k3", b"v3")
    assert first.due_ms == round((NOW + 13) * 1000) == handles[3].due_ms


def test_batches_are_split_by_count_and_by_bytes():
    producer = FakeProducer(partitions=1)
    with TimerClient(COMMON, producer=producer, clock=lambda: NOW) as client:
        client.schedule_many(specs(25), batch_size=10)
    assert [len(fs) for _, fs in batches(producer)] == [10, 10, 5]

    records, _ = build_batches(
        COMMON,
        [TimerSpec("orders", "k", b"x" * 300, delay=1, id=f"big-{i}") for i in range(10)],
        partitions=1,
        partition_of=crc32_partition,
        now=NOW,
        max_batch_bytes=1000,
    )
    assert all(len(r.value) <= 1000 for r in records)
    assert sum(len(FutureBatch.FromString(r.value).futures) for r in records) == 10


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 20_000), max_size=12),
    st.integers(1, 5),
    st.integers(1, 40_000),
)
def test_batch_values_are_the_batches_protobuf_writes(payload_sizes, max_count, max_bytes):
    # Payloads from none to 20,000 bytes: one-, two- and three-byte length prefixes.
    futures = [
        Future(callBackTopic="orders", callBackKey=f"k{i}", callBack=b"x" * n, id=f"id-{i}", due_ms=i)
        for i, n in enumerate(payload_sizes)
    ]
    values = list(batch_values([f.SerializeToString() for f in futures], max_count, max_bytes))
    chunks = [list(FutureBatch.FromString(v).futures) for v in values]
    assert [f for chunk in chunks for f in chunk] == futures
    for value, chunk in zip(values, chunks, strict=True):
        assert value == FutureBatch(futures=chunk).SerializeToString()
        assert 1 <= len(chunk) <= max_count
        assert len(value) <= max_bytes or len(chunk) == 1  # a timer larger than the bound goes alone
    # A chunk ends only where the next timer would not fit.
    for value, chunk, after in zip(values, chunks, chunks[1:], strict=False):
        assert (
            len(chunk) == max_count
            or len(value) + len(FutureBatch(futures=after[:1]).SerializeToString()) > max_bytes
        )


def test_the_partition_count_is_read_once_and_a_missing_topic_is_a_clear_error():
    producer = FakeProducer(partitions=2)
    client = TimerClient(COMMON, producer=producer, clock=lambda: NOW)
    client.schedule_many(specs(3))
    client.schedule_many(specs(3))
    assert producer.metadata_calls == 1
    missing = TimerClient(COMMON, producer=FakeProducer(partitions=0), clock=lambda: NOW)
    with pytest.raises(TimersError, match="timers topics create"):
        missing.schedule_many(specs(1))


def test_invalid_timers_are_refused_before_anything_is_sent():
    producer = FakeProducer()
    client = TimerClient(COMMON, producer=producer, clock=lambda: NOW)
    with pytest.raises(ValueError, match="delay"):
        client.schedule_many([*specs(3), TimerSpec("orders", "k", "v", delay=-1)])
    with pytest.raises(ValueError, match="TimerSpec"):
        client.schedule_many([("orders", "k", "v")])  # type: ignore[list-item]
    assert producer.sent == []


def test_the_java_partitioner_can_be_followed_and_others_are_refused():
    producer = FakeProducer(partitions=8)
    client = TimerClient(COMMON, producer=producer, producer_config={"partitioner": "murmur2_random"})
    client._producer = producer  # the fake instead of the real producer built from the config
    client.schedule_many(specs(20))
    for partition, futures in batches(producer):
        assert {murmur2_partition(f.id.encode(), 8) for f in futures} == {partition}
    with pytest.raises(ConfigError, match="partitioner='random'"):
        partitioner_for("random")


def test_kafka_murmur2_vectors():
    # From Kafka's own UtilsTest: the Java client hashes keys exactly so.
    def signed(x: int) -> int:
        return x - 2**32 if x >= 2**31 else x

    assert signed(murmur2(b"21")) == -973932308
    assert signed(murmur2(b"foobar")) == -790332482
    assert signed(murmur2(b"a-little-bit-long-string")) == -985981536
    assert signed(murmur2(b"abc")) == 479470107


def test_async_schedule_many_waits_for_every_batch():
    producer = FakeProducer(partitions=4)

    async def run():
        async with AsyncTimerClient(COMMON, producer=producer, clock=lambda: NOW) as client:
            return await client.schedule_many(specs(30))

    handles = asyncio.run(run())
    assert len(handles) == 30
    assert sum(len(fs) for _, fs in batches(producer)) == 30


@pytest.mark.parametrize(
    ("when", "due_ms"),
    [
        (datetime(2027, 1, 15, 8, 0, tzinfo=UTC), 1_800_000_000_000),
        (1_800_000_100.5, 1_800_000_100_500),
        (timedelta(seconds=30), round((NOW + 30) * 1000)),
    ],
)
def test_send_later_takes_the_java_argument_order(when, due_ms):
    producer = FakeProducer()
    with TimerClient(COMMON, producer=producer, clock=lambda: NOW) as client:
        handle = client.send_later("order-17", b"retry", "orders-retry", when, id="t-17")
    [sent] = producer.sent
    future = Future.FromString(sent.value)
    assert (future.callBackTopic, future.callBackKey, future.callBack) == (
        "orders-retry",
        "order-17",
        b"retry",
    )
    assert handle.due_ms == future.due_ms == due_ms
    assert sent.key == b"t-17"


def test_send_later_refuses_an_ambiguous_when():
    client = TimerClient(COMMON, producer=FakeProducer(), clock=lambda: NOW)
    with pytest.raises(ValueError, match="timedelta"):
        client.send_later("k", b"v", "orders", "in 5 minutes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="naive"):
        client.send_later("k", b"v", "orders", datetime(2027, 1, 1))


def test_async_send_later():
    producer = FakeProducer()

    async def run():
        async with AsyncTimerClient(COMMON, producer=producer, clock=lambda: NOW) as client:
            return await client.send_later("k", "v", "orders", timedelta(seconds=5))

    assert asyncio.run(run()).due_ms == round((NOW + 5) * 1000)
