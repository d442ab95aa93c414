"""The logs as the jobs read them from Kafka: each record decoded where it is read equals the same
record read raw and decoded afterwards (what tests/jobs/test_equivalence.py checks against its oracle)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from google.protobuf.message import DecodeError
from pyspark.sql import DataFrame, SparkSession

from futures.jobs.config import JobConfig
from futures.jobs.logs import (
    decode_event_rows,
    decode_requests,
    plan_log,
    read_events,
    read_ranges,
    read_requests,
)
from ktimers.config import CommonConfig, IngressFormat, KafkaConfig, TopicsConfig
from ktimers.topics import create_topics
from ktimers.wire import decode_events
from tests.jobs.crafted import Log
from tests.jobs.test_equivalence import EXTRA, crafted_log

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, log: Log) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, _, partition, _, when, headers in log.rows:
        pairs = [(h["key"], h["value"]) for h in headers]
        stamp = int(when.timestamp() * 1000)
        producer.produce(topic, value=value, key=key, partition=partition, headers=pairs, timestamp=stamp)
    assert producer.flush(10) == 0


def _rows(frame: DataFrame) -> list[tuple[object, ...]]:
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def test_records_decoded_as_read_equal_records_read_raw_and_decoded(
    spark: SparkSession, broker_env: dict[str, str], unique: Callable[[str], str]
) -> None:
    main, extra, events = crafted_log(seed=5, records=600)
    topics = TopicsConfig(
        request=unique("timer-request"),
        events=unique("timer-events"),
        oscillator=unique("oscillator"),
        dlq=unique("dlq"),
        partitions=4,
        ingress=((unique(EXTRA), IngressFormat.NATIVE),),
    )
    kafka = KafkaConfig(bootstrap_servers=broker_env["KAFKA_BOOTSTRAP_SERVERS"])
    common = CommonConfig(kafka=kafka, topics=topics)
    create_topics(common)
    bootstrap = common.kafka.bootstrap_servers
    _produce(bootstrap, topics.request, main)
    _produce(bootstrap, topics.ingress[0][0], extra)
    _produce(bootstrap, topics.events, events.log)
    limits = JobConfig(common=common).parse_limits()
    plan, _ = plan_log(common)
    assert plan.request_records == len(main.rows) + len(extra.rows)

    # Small splits: a partition is read by several tasks, each decoding its own piece.
    decoded = read_requests(spark, common, plan.requests, limits, max_records_per_split=50)
    raw = decode_requests(read_ranges(spark, common, plan.requests), limits)
    expected = _rows(raw)
    kinds = {row[5] for row in expected}
    assert kinds == {"schedule", "cancel", "invalid"}  # fast path, batches and rejections alike
    assert _rows(decoded) == expected

    decoded_events = read_events(spark, common, plan.events, max_records_per_split=50)
    assert _rows(decoded_events) == _rows(decode_event_rows(read_ranges(spark, common, plan.events)))
    # A batch record is a row per event it holds; anything else one row.
    assert decoded_events.count() == sum(
        _event_count(value, headers) for _, value, *_, headers in events.log.rows
    )
    assert decoded_events.count() > len(events.log.rows)


def _event_count(value: bytes | None, headers: list[dict[str, bytes | None]]) -> int:
    try:
        return (
            len(decode_events(value, [(h["key"], h["value"]) for h in headers])) if value is not None else 1
        )
    except DecodeError:
        return 1
