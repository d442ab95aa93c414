"""The request and event logs as DataFrames: pinned offset ranges, read and decoded.

:func:`plan_log` runs on the driver and touches only metadata; the records are
read by the Spark tasks (:mod:`futures.jobs.kafka_source`) and decoded as they
arrive (:func:`read_requests`, :func:`read_events`): what reaches Spark is the
columns the jobs use, never the raw records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from futures.ingress.limits import ParseLimits
from futures.jobs.decode import (
    EVENT_SCHEMA,
    REQUEST_SCHEMA,
    EventRows,
    RequestDecoder,
    RequestRows,
    decode_events,
)
from futures.jobs.errors import SourceError
from futures.jobs.kafka_source import (
    SOURCE_NAME,
    SOURCE_SCHEMA,
    consume_range,
    kafka_options,
    read_with,
)
from futures.jobs.offsets import OffsetPlanner, OffsetRange, split
from futures.jobs.versions import ORIGIN_LOG
from ktimers.config import CommonConfig
from ktimers.wire import KIND_HEADER, header_value, message_headers

log = logging.getLogger(__name__)

#: Rows per Arrow batch a reading task hands to Spark.
BATCH_ROWS = 10_000
#: A reading task fails when no record arrives for this long although its range is not done (seconds).
POLL_TIMEOUT_S = 60.0

#: ``{topic: {partition: (start, end)}}``
Offsets = dict[str, dict[int, tuple[int, int]]]


@dataclass(frozen=True)
class LogPlan:
    """Exactly which records a job reads: the manifest's "covers"."""

    cluster_id: str
    partitions: int
    requests: tuple[OffsetRange, ...]  # every request topic (timer-request and ingress topics)
    events: tuple[OffsetRange, ...]

    @property
    def request_records(self) -> int:
        return sum(r.size for r in self.requests)

    @property
    def event_records(self) -> int:
        return sum(r.size for r in self.events)


def request_topics(common: CommonConfig) -> list[str]:
    """`timer-request` first, then the extra ingress topics."""
    return list(common.topics.ingress_formats)


def offsets_of(ranges: Sequence[OffsetRange]) -> Offsets:
    out: Offsets = {}
    for r in ranges:
        out.setdefault(r.topic, {})[r.partition] = (r.start, r.end)
    return out


def plan_log(
    common: CommonConfig,
    request_starts: Mapping[str, Mapping[int, int]] | None = None,
    event_starts: Mapping[int, int] | None = None,
) -> tuple[LogPlan, dict[str, dict[int, tuple[int, int]]]]:
    """Pin the ranges to read, from the given starts (default: earliest) to the current ends.

    Returns the plan and the watermarks ``{topic: {partition: (low, high)}}``,
    for the caller's checks. The end of `timer-events` is pinned *before* the
    ends of the request topics: every event about a request in the plan that is
    not read now was produced after this moment, so the next compaction, which
    reads events from here, sees it.
    """
    kafka = common.kafka.librdkafka()
    with OffsetPlanner(kafka) as planner:
        cluster_id = planner.cluster_id()
        marks: dict[str, dict[int, tuple[int, int]]] = {}
        events_topic = common.topics.events
        marks[events_topic] = planner.watermarks(events_topic, planner.partitions(events_topic))
        events = _ranges(events_topic, marks[events_topic], event_starts or {})
        requests: list[OffsetRange] = []
        counts = set()
        for topic in request_topics(common):
            marks[topic] = planner.watermarks(topic, planner.partitions(topic))
            counts.add(len(marks[topic]))
            requests.extend(_ranges(topic, marks[topic], (request_starts or {}).get(topic, {})))
    if len(counts) != 1:
        raise SourceError(
            f"request topics {', '.join(request_topics(common))} have different partition counts "
            f"({sorted(counts)}): they must be co-partitioned"
        )
    return LogPlan(cluster_id, counts.pop(), tuple(requests), tuple(events)), marks


def _ranges(topic: str, marks: Mapping[int, tuple[int, int]], starts: Mapping[int, int]) -> list[OffsetRange]:
    return [
        OffsetRange(topic, p, max(starts.get(p, low), low), high) for p, (low, high) in sorted(marks.items())
    ]


def read_ranges(
    spark: SparkSession, common: CommonConfig, ranges: Sequence[OffsetRange], max_records_per_split: int = 0
) -> DataFrame:
    """The raw records of ``ranges`` (:data:`~futures.jobs.kafka_source.SOURCE_SCHEMA`)."""
    options: dict[str, Any] = kafka_options(common.kafka)
    frames = []
    for topic in dict.fromkeys(r.topic for r in ranges):
        mine = [r for r in ranges if r.topic == topic]
        starts = {str(r.partition): r.start for r in mine}
        ends = {str(r.partition): r.end for r in mine}
        frames.append(
            spark.read.format(SOURCE_NAME)
            .option("topic", topic)
            .option("startingOffsets", json.dumps(starts))
            .option("endingOffsets", json.dumps(ends))
            .option("maxRecordsPerSplit", str(max_records_per_split))
            .options(**options)
            .load()
        )
    if not frames:
        return spark.createDataFrame([], SOURCE_SCHEMA)
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


@dataclass(frozen=True)
class RequestReader:
    """Reads one range of a request topic into :data:`~futures.jobs.decode.REQUEST_SCHEMA` rows
    (a :data:`~futures.jobs.kafka_source.RangeRead`), decoding each record as it arrives."""

    limits: ParseLimits
    batch_rows: int = BATCH_ROWS
    poll_timeout_s: float = POLL_TIMEOUT_S

    def __call__(self, kafka: Mapping[str, Any], rng: OffsetRange) -> Iterator[pa.RecordBatch]:
        rows = RequestRows(self.limits)
        for msgs in consume_range(kafka, rng, self.batch_rows, self.poll_timeout_s):
            rows.add_messages(rng.topic, rng.partition, msgs)
            if len(rows) >= self.batch_rows:
                yield rows.batch()
        if len(rows):
            yield rows.batch()


@dataclass(frozen=True)
class EventReader:
    """Reads one range of `timer-events` into :data:`~futures.jobs.decode.EVENT_SCHEMA` rows."""

    batch_rows: int = BATCH_ROWS
    poll_timeout_s: float = POLL_TIMEOUT_S

    def __call__(self, kafka: Mapping[str, Any], rng: OffsetRange) -> Iterator[pa.RecordBatch]:
        rows = EventRows()
        for msgs in consume_range(kafka, rng, self.batch_rows, self.poll_timeout_s):
            for msg in msgs:
                headers = message_headers(msg)
                rows.add(msg.value(), header_value(headers, KIND_HEADER) if headers else None)
            if len(rows) >= self.batch_rows:
                yield rows.batch()
        if len(rows):
            yield rows.batch()


def read_requests(
    spark: SparkSession,
    common: CommonConfig,
    ranges: Sequence[OffsetRange],
    limits: ParseLimits,
    max_records_per_split: int = 0,
) -> DataFrame:
    """The request rows (:data:`~futures.jobs.decode.REQUEST_SCHEMA`, origin ``log``) of ``ranges``."""
    pieces = list(split(ranges, max_records_per_split))
    rows = read_with(spark, common.kafka.librdkafka(), pieces, RequestReader(limits), REQUEST_SCHEMA)
    return rows.withColumn("origin", F.lit(ORIGIN_LOG))


def read_events(
    spark: SparkSession, common: CommonConfig, ranges: Sequence[OffsetRange], max_records_per_split: int = 0
) -> DataFrame:
    """The event rows (:data:`~futures.jobs.decode.EVENT_SCHEMA`) of ``ranges`` of `timer-events`."""
    pieces = list(split(ranges, max_records_per_split))
    return read_with(spark, common.kafka.librdkafka(), pieces, EventReader(), EVENT_SCHEMA)


def decode_requests(raw: DataFrame, limits: ParseLimits) -> DataFrame:
    """Request rows (:data:`~futures.jobs.decode.REQUEST_SCHEMA`) of raw Kafka rows, origin ``log``."""
    return raw.mapInArrow(RequestDecoder(limits), REQUEST_SCHEMA).withColumn("origin", F.lit(ORIGIN_LOG))


def decode_event_rows(raw: DataFrame) -> DataFrame:
    """Event rows (:data:`~futures.jobs.decode.EVENT_SCHEMA`) of raw `timer-events` rows."""
    return raw.mapInArrow(decode_events, EVENT_SCHEMA)


def describe(plan: LogPlan) -> str:
    topics = ", ".join(dict.fromkeys(r.topic for r in plan.requests))
    return (
        f"{plan.request_records:,} request records ({topics}, {plan.partitions} partitions) "
        f"and {plan.event_records:,} events"
    )
