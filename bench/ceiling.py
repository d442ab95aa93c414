"""The ceiling: a plain confluent-kafka consume → produce pass-through on the same broker.

A timer service on this broker reads requests and writes callbacks; nothing it does
can be faster than copying records from one topic to another with librdkafka,
tuned for throughput (fetch queue backoff 10 ms, linger 10 ms, 1 MB batches: the
fastest settings found on the embedded broker). The records have the shape of
callbacks: a short key, the 100-byte payload and the four ``kt-*`` headers. The
producer gives the same guarantees as the worker's (idempotent, ``acks=all``).
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.cluster import PARTITIONS, BenchError, Broker
from bench.results import Throughput
from bench.workload import FAST_PRODUCER, PAYLOAD, callback_headers, callback_key

CONSUMER_TUNING = {
    # The default (1000 ms) caps consumption near 212 k msg/s (STACK.md).
    "fetch.queue.backoff.ms": 10,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 10_485_760,
}
PRODUCER_TUNING = {**FAST_PRODUCER, "enable.idempotence": True, "acks": "all"}
TIMEOUT_S = 300.0


def preload(broker: Broker, topic: str, count: int) -> None:
    producer = Producer({**broker.common.kafka.librdkafka(), **PRODUCER_TUNING})
    due_ms = int(time.time() * 1000)
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic, PAYLOAD, callback_key(i), headers=callback_headers(due_ms, due_ms + i % 1000)
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60) > 0:
        raise BenchError(f"ceiling: could not preload {topic}")


def measure(broker: Broker, count: int) -> Throughput:
    """Pass ``count`` records through; rate from the first record consumed to the last acknowledged."""
    source = broker.create_topic("bench-ceiling-in")
    sink = broker.create_topic("bench-ceiling-out")
    preload(broker, source, count)
    kafka = broker.common.kafka.librdkafka()
    consumer = Consumer(
        {
            **kafka,
            **CONSUMER_TUNING,
            "group.id": f"bench-ceiling-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    producer = Producer({**kafka, **PRODUCER_TUNING})
    consumer.assign([TopicPartition(source, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    moved = 0
    started: float | None = None
    give_up = time.monotonic() + TIMEOUT_S
    try:
        while moved < count:
            if time.monotonic() > give_up:
                raise BenchError(f"ceiling: only {moved} of {count} records passed through in {TIMEOUT_S:g}s")
            batch = consumer.consume(10_000, timeout=0.1)
            if batch and started is None:
                started = time.perf_counter()
            for msg in batch:
                if msg.error() is not None:
                    continue
                while True:
                    try:
                        producer.produce(sink, msg.value(), msg.key(), headers=msg.headers())
                        break
                    except BufferError:
                        producer.poll(0.01)
                moved += 1
            producer.poll(0)
        if producer.flush(60) > 0:
            raise BenchError("ceiling: records still unacknowledged after 60 s")
        seconds = time.perf_counter() - (started or time.perf_counter())
    finally:
        consumer.close()
    return Throughput(
        name="ceiling",
        count=count,
        rate=count / seconds if seconds > 0 else 0.0,
        seconds=seconds,
        detail="confluent-kafka consume → produce, idempotent acks=all, linger 10 ms, 1 MB batches",
    )
