"""Kafka for Spark through PySpark 4's Python data source API, on confluent-kafka.

Read::

    spark.dataSource.register(KafkaDataSource)
    df = (spark.read.format(SOURCE_NAME)
          .option("topic", "timer-request")
          .option("startingOffsets", '{"0": 100}')   # or earliest (default)
          .option("endingOffsets", "latest")         # or a JSON map; or *Timestamp (epoch ms)
          .options(**kafka_options(common.kafka))     # kafka.<librdkafka setting>
          .load())

One Spark input partition per Kafka partition and offset range (the driver plans
ranges from metadata; ``maxRecordsPerSplit`` cuts long ranges), read by a
consumer created inside the Spark task, so nothing passes through the driver.
Columns: :data:`SOURCE_SCHEMA`.

Read into rows of your own: :func:`read_with` runs a picklable function on each
offset range in a task of its own (:func:`consume_range` gives it the records) and
takes the Arrow batches it yields; the jobs decode records there, where they are read
(:mod:`futures.jobs.logs`).

Write: a DataFrame with ``value`` (binary) and optional ``key`` (binary),
``headers`` (as read), ``partition`` (int; null = by key) and ``topic``
(string; else the ``topic`` option)::

    df.write.format(SOURCE_NAME).mode("append").option("topic", "t").options(...).save()

Each task produces its rows, flushes, and fails when any record was not
delivered, so a Spark job only succeeds when Kafka acknowledged every record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from futures.jobs.errors import SourceError
from futures.jobs.offsets import (
    EARLIEST,
    LATEST,
    OffsetPlanner,
    OffsetRange,
    OffsetSpec,
    consumer_config,
    split,
)
from ktimers.config import KafkaConfig
from ktimers.errors import DeliveryError
from ktimers.wire import message_headers

log = logging.getLogger(__name__)

SOURCE_NAME = "timers_kafka"
KAFKA_PREFIX = "kafka."

SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)
HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.list_(HEADER_TYPE)),
    ]
)

#: Producer settings of the writer: durable (idempotent, acks=all) and batched, a linger and
#: large batches for throughput (docs/PERFORMANCE.md#the-spark-jobs).
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    # A record that cannot be delivered fails the task within a minute rather
    # than librdkafka's default five.
    "message.timeout.ms": 60_000,
}


def kafka_options(kafka: KafkaConfig) -> dict[str, str]:
    """The connection as data source options (``kafka.bootstrap.servers``...).

    Spark redacts option values whose names match ``password``/``secret`` in its
    plans and UI; the SASL password travels as ``kafka.sasl.password``.
    """
    return {f"{KAFKA_PREFIX}{k}": _option_text(v) for k, v in kafka.librdkafka().items()}


def _option_text(value: str | int | float | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _kafka_conf(options: Mapping[str, str]) -> dict[str, str]:
    conf = {k[len(KAFKA_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(KAFKA_PREFIX)}
    if "bootstrap.servers" not in conf:
        raise SourceError(
            "missing option kafka.bootstrap.servers (see futures.jobs.kafka_source.kafka_options)"
        )
    return conf


def _int_option(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise SourceError(f"option {name}={raw!r} is not an integer") from exc


@dataclass(frozen=True)
class ReadOptions:
    topic: str
    kafka: dict[str, str]
    start: OffsetSpec
    end: OffsetSpec
    max_records_per_split: int = 0
    batch_rows: int = 10_000
    #: A task fails when no record arrives for this long although its range is not done.
    poll_timeout_s: float = 60.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        topic = options.get("topic")
        if not topic:
            raise SourceError("missing option topic: the Kafka topic to read")
        start = OffsetSpec.parse(options.get("startingOffsets"), EARLIEST)
        end = OffsetSpec.parse(options.get("endingOffsets"), LATEST)
        if options.get("startingTimestamp"):
            start = OffsetSpec.at_time(_int_option(options, "startingTimestamp", 0))
        if options.get("endingTimestamp"):
            end = OffsetSpec.at_time(_int_option(options, "endingTimestamp", 0))
        return cls(
            topic=topic,
            kafka=_kafka_conf(options),
            start=start,
            end=end,
            max_records_per_split=_int_option(options, "maxRecordsPerSplit", 0),
            batch_rows=max(_int_option(options, "batchSize", cls.batch_rows), 1),
            poll_timeout_s=float(_int_option(options, "pollTimeoutSeconds", int(cls.poll_timeout_s))),
        )


class KafkaDataSource(DataSource):
    """``spark.read.format("timers_kafka")`` / ``df.write.format("timers_kafka")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaRangeReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise SourceError("a Kafka topic cannot be overwritten: write with mode('append')")
        names = set(schema.fieldNames())
        if "value" not in names:
            raise SourceError(f"writing to Kafka needs a 'value' column; the DataFrame has {sorted(names)}")
        topic = self.options.get("topic")
        if "topic" not in names and not topic:
            raise SourceError("writing to Kafka needs a 'topic' column or option")
        flush_s = float(_int_option(self.options, "flushTimeoutSeconds", 120))
        return KafkaRowWriter(_kafka_conf(self.options), topic or None, flush_s)


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        # Runs on the driver: metadata only. Consumers for the data are created
        # in read(), inside the tasks (a reader is pickled to the executors).
        o = self.options
        with OffsetPlanner(o.kafka) as planner:
            ranges = planner.ranges(o.topic, o.start, o.end)
        return [InputPartition(r) for r in split(ranges, o.max_records_per_split) if r.size > 0]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition.value, OffsetRange):
            return  # nothing to read: Spark plans one empty partition when partitions() is empty
        yield from read_range(self.options.kafka, partition.value, self.options.batch_rows,
                              self.options.poll_timeout_s)  # fmt: skip


#: Reads one offset range in a Spark task: (librdkafka settings, range) → Arrow batches.
RangeRead = Callable[[Mapping[str, Any], OffsetRange], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class _RangeTasks:
    """``mapInArrow`` function over ``spark.range(n, numPartitions=n)``: the task holding id i
    reads ``ranges[i]``, so every range is read by a task of its own, on the executors."""

    kafka: Mapping[str, Any]
    ranges: tuple[OffsetRange, ...]
    read: RangeRead

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in batch.column(0).to_pylist():
                yield from self.read(self.kafka, self.ranges[i])


def read_with(
    spark: SparkSession, kafka: Mapping[str, Any], ranges: Sequence[OffsetRange], read: RangeRead, schema: str
) -> DataFrame:
    """A DataFrame of ``schema`` made by ``read`` (picklable) of each range, one Spark task per range.

    For readers that turn records into rows of their own where they are read
    (:mod:`futures.jobs.logs`): the rows cross from Python to Spark once, and
    any Python object (parse limits...) reaches the tasks, not only string options.
    """
    todo = tuple(r for r in ranges if r.size > 0)
    if not todo:
        return spark.createDataFrame([], schema)
    ids = spark.range(0, len(todo), 1, numPartitions=len(todo))
    return ids.mapInArrow(_RangeTasks(dict(kafka), todo, read), schema)


def read_range(
    kafka: Mapping[str, Any], rng: OffsetRange, batch_rows: int, poll_timeout_s: float
) -> Iterator[pa.RecordBatch]:
    """The records of ``rng`` as Arrow batches of at most ``batch_rows`` rows."""
    rows = _Rows(rng.topic)
    for msgs in consume_range(kafka, rng, batch_rows, poll_timeout_s):
        for msg in msgs:
            rows.add(msg)
        if len(rows) >= batch_rows:
            yield rows.batch()
    if len(rows):
        yield rows.batch()


def consume_range(
    kafka: Mapping[str, Any], rng: OffsetRange, max_messages: int, poll_timeout_s: float
) -> Iterator[list[Message]]:
    """The records of ``rng``, in offset order, in lists of at most ``max_messages`` (and 10,000).

    Error events are handled here (the end of the partition) or raised
    (:class:`SourceError`): every message yielded is a record of the range.
    """
    if rng.size <= 0:
        return
    consumer = Consumer(consumer_config(kafka))
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        next_offset = rng.start
        last_progress = time.monotonic()
        while next_offset < rng.end:
            # Never ask for more than the range still holds: consume() waits its
            # whole timeout for the count asked, which would stall small ranges.
            msgs = consumer.consume(min(max_messages, 10_000, rng.end - next_offset), timeout=1.0)
            if msgs:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > poll_timeout_s:
                raise SourceError(
                    f"{rng.topic}[{rng.partition}]: no record for {poll_timeout_s:g}s at offset "
                    f"{next_offset}, planned to read up to {rng.end}"
                )
            records = []
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    next_offset = _end_of_partition(err, msg, rng, next_offset)
                    continue
                offset = msg.offset() or 0
                if offset >= rng.end:
                    next_offset = rng.end
                    break
                records.append(msg)
                next_offset = offset + 1
            if records:
                yield records
    finally:
        consumer.close()


def _end_of_partition(err: KafkaError, msg: Message, rng: OffsetRange, next_offset: int) -> int:
    """Where reading stands after an error event; raises when the range cannot be completed."""
    if err.code() != KafkaError._PARTITION_EOF:
        raise SourceError(f"reading {rng.topic}[{rng.partition}] at offset {next_offset}: {err.str()}")
    # The end of the partition, past any gap (aborted or control records).
    eof_at = msg.offset() or 0
    if eof_at >= rng.end:
        return rng.end
    if eof_at > next_offset:
        return eof_at
    return next_offset


def timestamp_ms(msg: Message) -> int:
    """A record's timestamp (epoch ms), -1 when it has none (as :class:`SourceRecord` has it)."""
    kind, ms = msg.timestamp()  # (type, epoch ms); type 0 = not available
    return ms if kind and ms >= 0 else -1


@dataclass
class _Rows:
    """Columns of one Arrow batch being filled."""

    topic: str
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int | None] = field(default_factory=list)
    headers: list[list[dict[str, Any]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, msg: Message) -> None:
        self.keys.append(msg.key())
        self.values.append(msg.value())
        self.partitions.append(msg.partition() or 0)
        self.offsets.append(msg.offset() or 0)
        ms = timestamp_ms(msg)
        self.timestamps.append(ms * 1000 if ms >= 0 else None)
        # Headers with a key that is not UTF-8 cannot be read here: the record is
        # judged without them, as the worker's read-back (futures/worker/gaps.py) does.
        headers = message_headers(msg) or ()
        self.headers.append([{"key": k, "value": v} for k, v in headers])

    def batch(self) -> pa.RecordBatch:
        n = len(self)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.topic] * n, pa.string()),
                pa.array(self.partitions, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, ARROW_SCHEMA.field("timestamp").type),
                pa.array(self.headers, pa.list_(HEADER_TYPE)),
            ],
            schema=ARROW_SCHEMA,
        )
        for column in (self.keys, self.values, self.partitions, self.offsets, self.timestamps, self.headers):
            column.clear()
        return batch


# -- writing ------------------------------------------------------------------


@dataclass
class Delivered(WriterCommitMessage):
    """What one task wrote: records acknowledged by Kafka."""

    records: int


class KafkaRowWriter(DataSourceArrowWriter):
    def __init__(self, kafka: dict[str, str], topic: str | None, flush_timeout_s: float) -> None:
        self.kafka = kafka
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Delivered:
        producer = Producer({**PRODUCER_DEFAULTS, **self.kafka})
        failures = _Failures()
        sent = 0
        for batch in iterator:
            columns = batch.to_pydict()
            values = columns["value"]
            n = len(values)
            keys = columns.get("key") or [None] * n
            topics = columns.get("topic") or [self.topic] * n
            partitions = columns.get("partition") or [None] * n
            headers = columns.get("headers") or [None] * n
            for i in range(n):
                topic = topics[i] or self.topic
                if not topic:
                    raise SourceError("a row has no topic and the writer has no topic option")
                _produce(producer, failures, topic, keys[i], values[i], partitions[i], headers[i])
            sent += n
            producer.poll(0)
        remaining = producer.flush(self.flush_timeout_s)
        if remaining:
            raise DeliveryError(
                f"{remaining} of {sent} records still undelivered after {self.flush_timeout_s:g}s "
                f"(kafka {self.kafka.get('bootstrap.servers')})"
            )
        failures.raise_first(sent)
        return Delivered(sent)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in messages if isinstance(m, Delivered))
        log.info("wrote %d records to Kafka", total)


@dataclass
class _Failures:
    count: int = 0
    first: str = ""

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.count += 1
            if not self.first:
                self.first = f"{msg.topic()}[{msg.partition()}]: {err.str()}"

    def raise_first(self, sent: int) -> None:
        if self.count:
            raise DeliveryError(f"{self.count} of {sent} records not delivered to Kafka, first: {self.first}")


def _produce(
    producer: Producer,
    on_delivery: _Failures,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    partition: int | None,
    headers: list[dict[str, Any]] | None,
) -> None:
    kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
    if partition is not None:
        kwargs["partition"] = partition
    if headers:
        kwargs["headers"] = [(h["key"], h["value"]) for h in headers]
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            # The local queue is full: serve delivery reports until there is room.
            producer.poll(0.1)
        except KafkaException as exc:  # refused before sending: unknown partition, too large...
            raise DeliveryError(f"{topic}[{partition}]: {exc.args[0].str() if exc.args else exc}") from exc
