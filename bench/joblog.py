"""The request log the compaction benchmark (:mod:`bench.jobs`) compacts.

N request records: 80 % schedules of new timers, 10 % reschedules of earlier ones
and 10 % cancels, with a FIRED event for every fifth timer.
"""

from __future__ import annotations

import random
import time

from confluent_kafka import Producer

from ktimers.config import CommonConfig
from ktimers.wire import KIND_CANCEL, KIND_HEADER, Cancel, Future, TimerEvent

PARTITIONS = 4


def fill(common: CommonConfig, records: int, seed: int = 7) -> int:
    """Write the request log and its events; returns the number of request records."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    producer = Producer(
        {
            **common.kafka.librdkafka(),
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    topics = common.topics
    base_ms = int(time.time() * 1000) + 3_600_000
    scheduled = 0
    for n in range(records):
        roll = rng.random()
        if roll < 0.1 and scheduled:
            timer_id = f"t{rng.randrange(scheduled)}"
            value, headers = Cancel(id=timer_id).SerializeToString(), [(KIND_HEADER, KIND_CANCEL)]
        else:
            timer_id = f"t{rng.randrange(scheduled)}" if roll < 0.2 and scheduled else f"t{scheduled}"
            if timer_id == f"t{scheduled}":
                scheduled += 1
            due = base_ms + rng.randrange(86_400_000)
            value = Future(
                callBackTopic="orders-retry",
                callBackKey=timer_id,
                callBack=b"x" * 100,
                id=timer_id,
                due_ms=due,
            ).SerializeToString()
            headers = []
        _produce(producer, topics.request, timer_id.encode(), value, headers)
        if n % 5 == 0 and not headers:
            # Offsets are not known before delivery; events name a partition-less
            # version here, which is enough to make the join do its work.
            event = TimerEvent(
                id=timer_id, kind=TimerEvent.Kind.FIRED, partition=0, source_offset=n, due_ms=0
            )
            _produce(producer, topics.events, timer_id.encode(), event.SerializeToString(), [])
    producer.flush(120)
    return records


def _produce(producer: Producer, topic: str, key: bytes, value: bytes, headers: list) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)
