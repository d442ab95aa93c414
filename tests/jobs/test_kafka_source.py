"""The Kafka data source on the embedded broker: exact offset ranges in, exact records out."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from futures.jobs.kafka_source import SOURCE_NAME, kafka_options
from ktimers.config import KafkaConfig

pytestmark = pytest.mark.integration

PER_PARTITION = 40


def create_topic(bootstrap: str, name: str, partitions: int = 4) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result()
    return name


def produce(bootstrap: str, topic: str, rows: list[tuple[int, bytes | None, bytes | None, list]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, key, value, headers in rows:
        producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
    assert producer.flush(10) == 0


@pytest.fixture
def bootstrap(broker_env: dict[str, str]) -> str:
    return broker_env["KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture
def options(bootstrap: str) -> dict[str, str]:
    return kafka_options(KafkaConfig(bootstrap_servers=bootstrap))


@pytest.fixture
def filled(bootstrap: str, unique: Callable[[str], str]) -> str:
    """A 4-partition topic with PER_PARTITION records in each: key p-i, value v-p-i, two headers."""
    topic = create_topic(bootstrap, unique("source"))
    rows = [
        (p, f"{p}-{i}".encode(), f"v-{p}-{i}".encode(), [("h", f"{i}".encode()), ("empty", None)])
        for i in range(PER_PARTITION)
        for p in range(4)
    ]
    produce(bootstrap, topic, rows)
    return topic


def test_reads_exactly_the_offset_ranges_it_is_given(spark: SparkSession, filled: str, options) -> None:
    ranges = {0: (5, 15), 1: (0, PER_PARTITION), 2: (10, 10), 3: (39, PER_PARTITION)}
    frame = (
        spark.read.format(SOURCE_NAME)
        .option("topic", filled)
        .option("startingOffsets", '{"0": 5, "1": 0, "2": 10, "3": 39}')
        .option("endingOffsets", '{"0": 15, "1": 40, "2": 10, "3": 40}')
        .options(**options)
        .load()
    )
    rows = frame.collect()
    got = sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows)
    want = sorted(
        (p, i, f"{p}-{i}".encode(), f"v-{p}-{i}".encode())
        for p, (start, end) in ranges.items()
        for i in range(start, end)
    )
    assert got == want
    # One Spark partition per non-empty Kafka range: the data never passes through the driver.
    assert frame.rdd.getNumPartitions() == 3
    first = next(r for r in rows if (r["partition"], r["offset"]) == (0, 5))
    assert first["topic"] == filled
    assert [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in first["headers"]] == [
        ("h", b"5"),
        ("empty", None),
    ]
    assert abs(first["timestamp"].timestamp() - time.time()) < 120


def test_earliest_to_latest_in_small_splits_reads_everything_once(
    spark: SparkSession, filled: str, options
) -> None:
    frame = (
        spark.read.format(SOURCE_NAME)
        .option("topic", filled)
        .option("maxRecordsPerSplit", "7")
        .options(**options)
        .load()
    )
    assert frame.rdd.getNumPartitions() == 4 * 6  # ceil(40 / 7) splits per partition
    offsets = sorted((r["partition"], r["offset"]) for r in frame.select("partition", "offset").collect())
    assert offsets == [(p, i) for p in range(4) for i in range(PER_PARTITION)]


def test_starting_timestamp_skips_older_records(
    spark: SparkSession, bootstrap: str, unique: Callable[[str], str], options
) -> None:
    topic = create_topic(bootstrap, unique("times"))
    produce(bootstrap, topic, [(p, None, b"old", []) for p in range(4)])
    time.sleep(0.05)
    since_ms = time.time_ns() // 1_000_000
    time.sleep(0.05)
    produce(bootstrap, topic, [(p, None, b"new", []) for p in range(4)])
    frame = (
        spark.read.format(SOURCE_NAME)
        .option("topic", topic)
        .option("startingTimestamp", str(since_ms))
        .options(**options)
        .load()
    )
    assert sorted(bytes(r["value"]) for r in frame.collect()) == [b"new"] * 4


def test_writer_round_trips_keys_values_headers_and_partitions(
    spark: SparkSession, bootstrap: str, unique: Callable[[str], str], options
) -> None:
    topic = create_topic(bootstrap, unique("written"))
    headers = [[{"key": "n", "value": str(i).encode()}, {"key": "null", "value": None}] for i in range(50)]
    rows = [(i % 4, None if i == 0 else f"k{i}".encode(), f"v{i}".encode(), headers[i]) for i in range(50)]
    frame = spark.createDataFrame(
        rows, "partition int, key binary, value binary, headers array<struct<key:string,value:binary>>"
    )
    frame.write.format(SOURCE_NAME).mode("append").option("topic", topic).options(**options).save()

    back = spark.read.format(SOURCE_NAME).option("topic", topic).options(**options).load().collect()

    def normal(partition, key, value, headers):
        hs = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in headers)
        return (partition, key is not None, bytes(key or b""), bytes(value), hs)

    assert sorted(normal(r["partition"], r["key"], r["value"], r["headers"]) for r in back) == sorted(
        normal(*row) for row in rows
    )


def test_writer_fails_the_job_when_a_record_is_not_delivered(
    spark: SparkSession, bootstrap: str, unique: Callable[[str], str], options
) -> None:
    topic = create_topic(bootstrap, unique("refusing"), partitions=1)
    frame = spark.createDataFrame([(0, b"ok"), (7, b"no such partition")], "partition int, value binary")
    with pytest.raises(Exception, match="Unknown partition"):
        frame.write.format(SOURCE_NAME).mode("append").option("topic", topic).options(**options).save()
