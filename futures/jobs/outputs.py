"""Kafka records the jobs write: timers re-published as requests, or their callbacks.

Both are DataFrames in the writer's shape (``topic``, ``partition``, ``key``,
``value``, ``headers``), written by the Spark tasks through
:mod:`futures.jobs.kafka_source`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from futures.jobs.errors import JobError
from futures.jobs.kafka_source import HEADER_TYPE, SOURCE_NAME, kafka_options
from futures.jobs.offsets import OffsetPlanner
from ktimers.config import CommonConfig
from ktimers.wire import KIND_FUTURE, KIND_HEADER, Future, StoredTimer, callback_headers

RECORD_SCHEMA = (
    "topic string, partition int, key binary, value binary, headers array<struct<key:string,value:binary>>"
)
_RECORD_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(HEADER_TYPE)),
    ]
)


def request_records(timers: DataFrame, topic: str, keep_partitions: bool) -> DataFrame:
    """Timers as `timer-request` records: the normalised Future, keyed by its id.

    Same id → same timer: the worker replaces a pending timer when a request with
    its id reaches its partition, so publishing a timer twice schedules it once.
    ``keep_partitions`` writes each timer to the partition it was requested in
    (where a worker may still hold it); otherwise the producer picks the
    partition from the key, exactly as :class:`~futures.client.TimerClient` does.
    """
    partition = F.col("partition").cast("int") if keep_partitions else F.lit(None).cast("int")
    headers = F.array(F.struct(F.lit(KIND_HEADER).alias("key"), F.lit(KIND_FUTURE).alias("value")))
    return timers.select(
        F.lit(topic).alias("topic"),
        partition.alias("partition"),
        F.encode(F.col("timer_id"), "UTF-8").alias("key"),
        F.col("future").alias("value"),
        headers.alias("headers"),
    )


def callback_records(timers: DataFrame) -> DataFrame:
    """The callbacks of ``timers`` exactly as the worker sends them (key, value, headers)."""
    return timers.select("future", "partition", "offset").mapInArrow(_callbacks, RECORD_SCHEMA)


def _callbacks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # The worker's own header builder: receivers see kt-id, kt-due-ms, kt-token
    # and kt-fired-ms as on any callback, so their de-duplication by id works.
    for batch in batches:
        futures = [Future.FromString(raw) for raw in batch.column("future").to_pylist()]
        latest = max(futures, key=lambda f: f.due_ms, default=None)
        fired_ms = not_before(latest.due_ms, f"timer {latest.id!r}") if latest else 0
        out: dict[str, list[Any]] = {name: [] for name in _RECORD_ARROW.names}
        partitions = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        fired = str(fired_ms).encode()
        for future, partition, offset in zip(futures, partitions, offsets, strict=True):
            timer = StoredTimer(future=future, source_partition=partition, source_offset=offset)
            out["topic"].append(future.callBackTopic)
            out["partition"].append(None)
            out["key"].append(future.callBackKey.encode())
            out["value"].append(future.callBack)
            out["headers"].append([{"key": k, "value": v} for k, v in callback_headers(timer, fired)])
        yield pa.RecordBatch.from_pydict(out, schema=_RECORD_ARROW)


#: How long a Spark task waits for a callback to become due before it refuses (seconds).
#: ``timers-replay`` only sends timers due before now; this covers an executor whose clock
#: is a little behind the driver's. Further ahead is no clock skew but a timer not yet due.
MAX_EARLY_WAIT_S = 10.0


def not_before(due_ms: int, what: str = "a timer") -> int:
    """The clock (epoch ms) once it reads ``due_ms`` (epoch ms) or later: never send early.

    Waits up to :data:`MAX_EARLY_WAIT_S`; further ahead raises :class:`JobError` naming ``what``.
    """
    now = time.time_ns() // 1_000_000
    if due_ms - now > MAX_EARLY_WAIT_S * 1000:
        raise JobError(
            f"refusing to send the callback of {what} {(due_ms - now) / 1000:.1f}s before it is due "
            "(a timer never fires early): re-send only timers already due"
        )
    while now < due_ms:
        time.sleep((due_ms - now) / 1000)
        now = time.time_ns() // 1_000_000
    return now


def write_records(records: DataFrame, common: CommonConfig) -> None:
    """Write in the Spark tasks; fails unless Kafka acknowledged every record."""
    records.write.format(SOURCE_NAME).mode("append").options(**kafka_options(common.kafka)).save()


def create_fresh_topic(common: CommonConfig, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions``; an existing one must be empty and as wide."""
    kafka = common.kafka.librdkafka()
    with OffsetPlanner(kafka) as planner:
        try:
            existing = planner.partitions(topic)
        except JobError:
            existing = []
        if existing:
            marks = planner.watermarks(topic, existing)
            if any(high > 0 for _, high in marks.values()) or len(existing) != partitions:
                raise JobError(
                    f"topic {topic!r} already exists ({len(existing)} partitions, "
                    f"{sum(h for _, h in marks.values()):,} records): a new generation needs a fresh topic; "
                    "choose another name"
                )
            return
    admin = AdminClient(kafka)
    replication = common.kafka.settings.replication_factor
    future = admin.create_topics([NewTopic(topic, partitions, replication)])[topic]
    try:
        future.result()
    except KafkaException as exc:
        raise JobError(f"could not create topic {topic!r}: {exc}") from exc
