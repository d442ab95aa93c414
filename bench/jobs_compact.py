"""How fast ``timers-compact`` compacts a request log: ``python -m bench.jobs_compact [--records N]``.

Writes N request records to a fresh topic set (on the embedded broker, or on
``KAFKA_BOOTSTRAP_SERVERS``): 80 % schedules of new timers, 10 % reschedules of
earlier ones and 10 % cancels, with a FIRED event for every fifth timer. Then
runs the compaction (plan, read, decode, classify, write the Parquet snapshot)
on ``local[2]`` and prints request rows per second of the whole job, without the
SparkSession start. The machine is shared: the load average is printed with it.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import tempfile
import time
import uuid

from confluent_kafka import Producer

from futures.jobs.compact import CompactOptions, run
from futures.jobs.config import JobConfig
from futures.jobs.session import SparkSettings, build_session
from ktimers.broker import start_broker
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs_compact", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    broker = None if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") else start_broker()
    try:
        env = dict(os.environ) if broker is None else {**os.environ, **broker.env()}
        suffix = uuid.uuid4().hex[:8]
        env.update(
            TIMERS_TOPIC_OSCILLATOR=f"oscillator-{suffix}",
            TIMERS_TOPIC_REQUEST=f"timer-request-{suffix}",
            TIMERS_TOPIC_EVENTS=f"timer-events-{suffix}",
            TIMERS_TOPIC_DLQ=f"timer-request-dlq-{suffix}",
            TIMERS_PARTITIONS=str(PARTITIONS),
        )
        config = JobConfig.from_env(env)
        create_topics(config.common)
        started = time.monotonic()
        fill(config.common, args.records)
        print(f"wrote {args.records:,} request records in {time.monotonic() - started:.1f}s")
        spark = build_session(SparkSettings(master=args.master, progress=False, shuffle_partitions=8))
        try:
            with tempfile.TemporaryDirectory(prefix="compact-bench-") as out:
                load_before = os.getloadavg()
                result = run(spark, config, CompactOptions(out=f"{out}/snapshot"))
                load_after = os.getloadavg()
        finally:
            spark.stop()
        counts = result.counts
        print(
            f"compacted {counts.read:,} request rows and {counts.events_read:,} events on {args.master} in "
            f"{result.seconds:.1f}s: {counts.read / result.seconds:,.0f} request rows/s "
            f"({counts.pending:,} pending, {counts.superseded:,} superseded, {counts.cancelled:,} cancelled)"
        )
        before, after = ("/".join(f"{x:.2f}" for x in load) for load in (load_before, load_after))
        print(f"load average (1/5/15 min) before {before}, after {after}, on {os.cpu_count()} cores")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
