"""Decode Kafka records into request and event rows, inside Spark tasks, in Arrow batches.

Requests go through :class:`futures.ingress.requests.RequestParser` (what
:func:`~futures.ingress.requests.parse_record` uses), the worker's own parser, so the
jobs and the worker never disagree on what a record means. The parser gets a
*permissive* limits (:meth:`futures.ingress.limits.ParseLimits.permissive`: no
callback-topic allow-list, no payload or due-time limits): what the worker
refused because of its limits is on `timer-events` as REJECTED, and deciding it
here from the job's environment could drop a timer the worker accepted.

Records are decoded where they are read (:mod:`futures.jobs.logs`), one Arrow
batch of finished rows at a time: a record crosses from Python to Spark once, as
the few columns the classification needs, never as a raw Kafka row to be decoded
by another Python pass. :class:`RequestDecoder` and :func:`decode_events` decode
DataFrames of raw Kafka rows (``mapInArrow``) with the same code.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from futures.ingress.limits import ParseLimits
from futures.ingress.native import fast_parse
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, Request, RequestParser, Schedule
from ktimers.config import IngressFormat
from ktimers.wire import (
    KIND_BATCH,
    KIND_HEADER,
    BatchPart,
    KafkaHeaders,
    ScheduledTimers,
    TimerEvent,
    TimerEventBatch,
    batch_parts,
    fired_columns,
    header_value,
    message_headers,
    scheduled_columns,
)

_FIRED_NAME = TimerEvent.Kind.Name(TimerEvent.FIRED)
_SCHEDULED_NAME = TimerEvent.Kind.Name(TimerEvent.SCHEDULED)

# Kinds of decoded request rows.
SCHEDULE = "schedule"
CANCEL = "cancel"
INVALID = "invalid"
#: Reason of an invalid row whose record had no value (a Kafka tombstone) and is no cancel.
TOMBSTONE = "tombstone"

REQUEST_SCHEMA = (
    "topic string, partition int, offset long, idx int, timestamp_ms long, kind string, "
    "timer_id string, due_ms long, callback_topic string, future binary, reason string"
)
_REQUEST_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("idx", pa.int32()),
        ("timestamp_ms", pa.int64()),
        ("kind", pa.string()),
        ("timer_id", pa.string()),
        ("due_ms", pa.int64()),
        ("callback_topic", pa.string()),
        ("future", pa.binary()),
        ("reason", pa.string()),
    ]
)

# Kinds of decoded event rows besides the TimerEvent.Kind names (FIRED...).
UNDECODABLE = "UNDECODABLE"
EVENT_TOMBSTONE = "TOMBSTONE"

EVENT_SCHEMA = (
    "timer_id string, kind string, partition int, source_offset long, due_ms long, at_ms long, reason string"
)
_EVENT_ARROW = pa.schema(
    [
        ("timer_id", pa.string()),
        ("kind", pa.string()),
        ("partition", pa.int32()),
        ("source_offset", pa.int64()),
        ("due_ms", pa.int64()),
        ("at_ms", pa.int64()),
        ("reason", pa.string()),
    ]
)


class RequestRows:
    """Request rows (:data:`REQUEST_SCHEMA`) of records, gathered column by column for one Arrow batch.

    Single Futures and Cancels of the native format, nearly every record of
    `timer-request`, take :func:`futures.ingress.native.fast_parse`; every other
    record the parser's full path (:meth:`RequestParser.parse`).
    """

    def __init__(self, limits: ParseLimits, now_ms: int | None = None) -> None:
        # The worker clock at ingest only matters to a format that counts from
        # "now" when a record has no timestamp (the rest use the record's time),
        # so one parser, at the job's clock, serves every record of a task.
        self._parser = RequestParser(limits, time.time_ns() // 1_000_000 if now_ms is None else now_ms)
        self._context = self._parser.context
        formats = limits.topics.ingress_formats
        self._native = frozenset(topic for topic, fmt in formats.items() if fmt is IngressFormat.NATIVE)
        self._columns: list[list[Any]] = [[] for _ in _REQUEST_ARROW]
        # Rows of the fast path, by topic partition (add_messages): only the columns that vary.
        self._fast: list[_FastRun] = []
        self._fast_rows = 0

    def __len__(self) -> int:
        return len(self._columns[2]) + self._fast_rows

    def add_messages(self, topic: str, partition: int, messages: Iterable[Message]) -> None:
        """Records of one topic partition as confluent-kafka consumed them (no error events)."""
        # The loop every record of a compaction goes through: plain locals, no call per record
        # but the decoding itself, and an append only for the columns that differ from row to
        # row (topic, partition, idx and reason are the same for every row of the fast path,
        # and the kind follows from due_ms: batch() makes those columns).
        context = self._context
        native = topic in self._native
        run = _FastRun(topic, partition)
        offsets, stamps, ids, dues, callbacks, futures = (c.append for c in run.columns)
        for msg in messages:
            # None when a header key is not UTF-8: the record is then judged without its headers,
            # as the worker's read-back (futures/worker/gaps.py) does.
            headers = message_headers(msg)
            kind = header_value(headers, KIND_HEADER) if headers else None
            value, offset = msg.value(), msg.offset() or 0
            stamp_type, stamp = msg.timestamp()
            stamp_ms = stamp if stamp_type and stamp >= 0 else -1
            found = fast_parse(kind, value, context, topic) if native else None
            if found is None:
                self._parse(SourceRecord(topic, partition, offset, msg.key(), value, headers or (), stamp_ms))
                continue
            offsets(offset)
            stamps(stamp_ms)
            if isinstance(found, str):
                ids(found)
                dues(None)
                callbacks(None)
                futures(None)
            else:
                ids(found.id)
                dues(found.due_ms)
                callbacks(found.callBackTopic)
                # fast_parse only answers for a Future that names its id and due_ms: the
                # value is the normalised Future already, no need to serialize it again.
                futures(value)
        if run.columns[0]:
            self._fast.append(run)
            self._fast_rows += len(run.columns[0])

    def add(
        self,
        topic: str,
        partition: int,
        offset: int,
        stamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: KafkaHeaders,
    ) -> None:
        """One record, field by field; ``stamp_ms``: its timestamp, epoch ms or -1."""
        kind = header_value(headers, KIND_HEADER)
        found = fast_parse(kind, value, self._context, topic) if topic in self._native else None
        if found is None:
            self._parse(SourceRecord(topic, partition, offset, key, value, headers, stamp_ms))
        elif isinstance(found, str):
            self._append((topic, partition, offset, 0, stamp_ms, CANCEL, found, None, None, None, None))
        else:
            timer = (found.id, found.due_ms, found.callBackTopic, value)
            self._append((topic, partition, offset, 0, stamp_ms, SCHEDULE, *timer, None))

    def _parse(self, record: SourceRecord) -> None:
        for idx, request in enumerate(self._parser.parse(record)):
            self._append(_row(record, idx, request))

    def _append(self, row: tuple[Any, ...]) -> None:
        for column, value in zip(self._columns, row, strict=True):
            column.append(value)

    def batch(self) -> pa.RecordBatch:
        """The rows gathered so far, as one batch; starts a new one."""
        batch = pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(self._columns, _REQUEST_ARROW, strict=True)],
            schema=_REQUEST_ARROW,
        )
        self._columns = [[] for _ in _REQUEST_ARROW]
        runs = [run.batch() for run in self._fast]
        self._fast, self._fast_rows = [], 0
        if not runs:
            return batch
        return pa.concat_batches([*runs, batch] if batch.num_rows else runs)


class _FastRun:
    """Fast-path rows of one topic partition: offset, timestamp, timer id, due_ms, callback topic
    and Future (a cancel has no due_ms, callback topic nor Future)."""

    __slots__ = ("columns", "partition", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.columns: tuple[list[Any], ...] = ([], [], [], [], [], [])

    def batch(self) -> pa.RecordBatch:
        offsets, stamps, ids, dues, callbacks, futures = self.columns
        n = len(offsets)
        due = pa.array(dues, pa.int64())
        return pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(self.topic, pa.string()), n),
                pa.repeat(pa.scalar(self.partition, pa.int32()), n),
                pa.array(offsets, pa.int64()),
                pa.repeat(pa.scalar(0, pa.int32()), n),
                pa.array(stamps, pa.int64()),
                pc.if_else(pc.is_null(due), CANCEL, SCHEDULE),
                pa.array(ids, pa.string()),
                due,
                pa.array(callbacks, pa.string()),
                pa.array(futures, pa.binary()),
                pa.nulls(n, pa.string()),
            ],
            schema=_REQUEST_ARROW,
        )


def _row(record: SourceRecord, idx: int, request: Request) -> tuple[Any, ...]:
    where = (record.topic, record.partition, record.offset, idx, record.timestamp_ms)
    if isinstance(request, Schedule):
        future = request.timer.future
        return (*where, SCHEDULE, request.timer_id, request.due_ms, future.callBackTopic,
                future.SerializeToString(), None)  # fmt: skip
    if isinstance(request, CancelRequest):
        return (*where, CANCEL, request.timer_id, None, None, None, None)
    # A tombstone is counted as such, whatever the format calls it.
    reason = TOMBSTONE if record.value is None else request.reason
    return (*where, INVALID, request.timer_id or None, None, None, None, reason)


class EventRows:
    """Event rows (:data:`EVENT_SCHEMA`) of `timer-events` records, gathered for one Arrow batch.

    One row per event: a ``TimerEventBatch`` record (``kt-kind: batch``, as the worker
    writes them) gives a row for each of its events, a lone ``TimerEvent`` record one.
    A record that is neither becomes one row of kind ``UNDECODABLE`` (``TOMBSTONE``
    without a value), counted, never fatal.
    """

    def __init__(self) -> None:
        # Kind names by number in a dict (cheaper than Kind.Name, which still says why a number is unknown).
        self._known = {number: TimerEvent.Kind.Name(number) for number in TimerEvent.Kind.values()}
        self._rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, value: bytes | None, record_kind: bytes | None) -> None:
        """One `timer-events` record: its value and its ``kt-kind`` header (last value, or None)."""
        if value is None:
            self._rows.append((None, EVENT_TOMBSTONE, None, None, None, None, None))
            return
        known, name = self._known, TimerEvent.Kind.Name
        try:
            if record_kind == KIND_BATCH:
                parts: list[BatchPart] = batch_parts(TimerEventBatch.FromString(value))
            else:
                parts = [TimerEvent.FromString(value)]
            rows: list[tuple[Any, ...]] = []
            for part in parts:
                if isinstance(part, TimerEvent):
                    kind = known.get(part.kind) or name(part.kind)
                    rows.append(
                        (
                            part.id,
                            kind,
                            part.partition,
                            part.source_offset,
                            part.due_ms,
                            part.at_ms,
                            part.reason,
                        )
                    )
                    continue
                # SCHEDULED or FIRED events column by column (a row names no callback topic).
                columns: Iterable[tuple[str, int, int]]
                if isinstance(part, ScheduledTimers):
                    block_kind, columns = _SCHEDULED_NAME, (c[:3] for c in scheduled_columns(part))
                else:
                    block_kind, columns = _FIRED_NAME, fired_columns(part)
                at_ms, partition = part.at_ms, part.partition
                rows.extend(
                    (timer_id, block_kind, partition, offset, due_ms, at_ms, "")
                    for timer_id, due_ms, offset in columns
                )
        except Exception as exc:  # noqa: BLE001 - DecodeError, or an unknown enum value
            self._rows.append((None, UNDECODABLE, None, None, None, None, f"{exc.__class__.__name__}: {exc}"))
            return
        self._rows.extend(rows)

    def batch(self) -> pa.RecordBatch:
        batch = _batch(self._rows, _EVENT_ARROW)
        self._rows = []
        return batch


def _batch(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.RecordBatch.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


# -- DataFrames of raw Kafka rows (mapInArrow) ------------------------------------


def _timestamps_ms(column: pa.Array) -> pa.Array:
    """Kafka timestamps (µs) as epoch ms, -1 where unknown (as :class:`SourceRecord` has them)."""
    micros = column.cast(pa.int64())
    millis = np.floor_divide(pc.fill_null(micros, 0).to_numpy(), 1000)
    return pc.if_else(pc.is_null(micros), -1, pa.array(millis, pa.int64()))


class RequestDecoder:
    """``mapInArrow`` function: raw Kafka rows (:data:`~futures.jobs.kafka_source.SOURCE_SCHEMA`)
    of any request topic → :data:`REQUEST_SCHEMA` rows, one per request a record holds."""

    def __init__(self, limits: ParseLimits) -> None:
        self.limits = limits

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = RequestRows(self.limits)
        for batch in batches:
            columns = [batch.column(n).to_pylist() for n in ("topic", "partition", "offset", "key", "value")]
            stamps = _timestamps_ms(batch.column("timestamp")).to_pylist()
            headers = batch.column("headers").to_pylist()
            for topic, partition, offset, key, value, stamp, hdrs in zip(
                *columns, stamps, headers, strict=True
            ):
                pairs = tuple((h["key"], h["value"]) for h in hdrs or ())
                rows.add(topic, partition, offset, stamp, key, value, pairs)
            yield rows.batch()


def decode_events(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: raw `timer-events` rows → :data:`EVENT_SCHEMA` rows."""
    rows = EventRows()
    for batch in batches:
        headers = batch.column("headers").to_pylist()
        for value, hdrs in zip(batch.column("value").to_pylist(), headers, strict=True):
            rows.add(value, header_value([(h["key"], h["value"]) for h in hdrs or ()], KIND_HEADER))
        yield rows.batch()
