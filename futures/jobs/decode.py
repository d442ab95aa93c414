"""Decode Kafka rows into request and event rows, inside Spark tasks (``mapInArrow``).

Requests go through :class:`futures.ingress.requests.RequestParser` (what
:func:`~futures.ingress.requests.parse_record` uses), the worker's own parser, so the
jobs and the worker never disagree on what a record means. The parser gets a
*permissive* limits (:meth:`futures.ingress.limits.ParseLimits.permissive`: no
callback-topic allow-list, no payload or due-time limits): what the worker
refused because of its limits is on `timer-events` as REJECTED, and deciding it
here from the job's environment could drop a timer the worker accepted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from futures.ingress.limits import ParseLimits
from futures.ingress.native import fast_parse
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, Request, RequestParser, Schedule
from ktimers.config import IngressFormat
from ktimers.wire import KIND_BATCH, KIND_HEADER, TimerEvent, TimerEventBatch

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


def _timestamps_ms(column: pa.Array) -> pa.Array:
    """Kafka timestamps (µs) as epoch ms, -1 where unknown (as :class:`SourceRecord` has them)."""
    micros = column.cast(pa.int64())
    millis = np.floor_divide(pc.fill_null(micros, 0).to_numpy(), 1000)
    return pc.if_else(pc.is_null(micros), -1, pa.array(millis, pa.int64()))


def _kind_headers(headers: pa.Array) -> list[bytes | None]:
    """The last ``kt-kind`` header of every row (:func:`~ktimers.wire.header_value`), without
    turning every row's header list into Python objects: most records have none."""
    kinds: list[bytes | None] = [None] * len(headers)
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return kinds
    mask = pc.equal(flat.field("key"), KIND_HEADER)
    rows = pc.filter(pc.list_parent_indices(headers), mask).to_pylist()
    values = pc.filter(flat.field("value"), mask).to_pylist()
    for row, value in zip(rows, values, strict=True):
        kinds[row] = value  # in order: the last one wins
    return kinds


@dataclass(frozen=True)
class RequestDecoder:
    """``mapInArrow`` function: Kafka rows (:data:`~futures.jobs.kafka_source.SOURCE_SCHEMA`)
    of any request topic → :data:`REQUEST_SCHEMA` rows, one per request a record holds.

    Single Futures and Cancels of the native format, nearly every record of
    `timer-request`, take :func:`futures.ingress.native.fast_parse`; every other
    record the parser's full path (:meth:`RequestParser.parse`).
    """

    limits: ParseLimits

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.decode(batch)

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        # The worker clock at ingest only matters to a format that counts from
        # "now" when a record has no timestamp (the rest use the record's time),
        # so one parser, at the job's clock, serves the whole batch.
        parser = RequestParser(self.limits, time.time_ns() // 1_000_000)
        context = parser.context
        native = _native_topics(self.limits)
        topics = batch.column("topic").to_pylist()
        values = batch.column("value").to_pylist()
        kinds = _kind_headers(batch.column("headers"))
        # One row per record: (idx, kind, timer_id, due_ms, callback_topic, future, reason).
        rows: list[_Row] = []
        slow: list[int] = []
        for i, (topic, kind, value) in enumerate(zip(topics, kinds, values, strict=True)):
            found = fast_parse(kind, value, context) if topic in native else None
            if found is None:
                slow.append(i)
                rows.append(_SLOW)
            elif found.__class__ is str:
                rows.append((0, CANCEL, found, None, None, None, None))
            else:
                rows.append((0, SCHEDULE, found.id, found.due_ms, found.callBackTopic, value, None))  # type: ignore[union-attr]
        src = None
        if slow:
            src, rows = _with_slow(rows, batch, slow, parser)
        return _request_batch(batch, src, rows)


_Row = tuple[int, str, str | None, int | None, str | None, bytes | None, str | None]
_SLOW: _Row = (0, "", None, None, None, None, None)


def _with_slow(
    fast: list[_Row], batch: pa.RecordBatch, slow: list[int], parser: RequestParser
) -> tuple[list[int], list[_Row]]:
    """(source row, row) of every request: ``fast`` with the records in ``slow`` fully parsed."""
    stamps = _timestamps_ms(batch.column("timestamp")).to_pylist()
    parsed: dict[int, list[_Row]] = {}
    for i, raw in zip(slow, batch.take(pa.array(slow, pa.int64())).to_pylist(), strict=True):
        record = SourceRecord(
            topic=raw["topic"],
            partition=raw["partition"],
            offset=raw["offset"],
            key=raw["key"],
            value=raw["value"],
            headers=tuple((h["key"], h["value"]) for h in raw["headers"] or ()),
            timestamp_ms=stamps[i],
        )
        parsed[i] = [_row(idx, request) for idx, request in enumerate(parser.parse(record))]
    src: list[int] = []
    rows: list[_Row] = []
    for i, row in enumerate(fast):
        mine = parsed.get(i, [row]) if row is _SLOW else [row]
        src += [i] * len(mine)
        rows += mine
    return src, rows


def _row(idx: int, request: Request) -> _Row:
    if isinstance(request, Schedule):
        future = request.timer.future
        return (idx, SCHEDULE, request.timer_id, request.due_ms, future.callBackTopic,
                future.SerializeToString(), None)  # fmt: skip
    if isinstance(request, CancelRequest):
        return (idx, CANCEL, request.timer_id, None, None, None, None)
    # A tombstone is counted as such, whatever the format calls it.
    reason = TOMBSTONE if request.record.value is None else request.reason
    return (idx, INVALID, request.timer_id or None, None, None, None, reason)


def _native_topics(limits: ParseLimits) -> frozenset[str]:
    formats = limits.topics.ingress_formats
    return frozenset(topic for topic, fmt in formats.items() if fmt is IngressFormat.NATIVE)


_ROW_TYPES = (pa.int32(), pa.string(), pa.string(), pa.int64(), pa.string(), pa.binary(), pa.string())


def _request_batch(source: pa.RecordBatch, src: list[int] | None, rows: list[_Row]) -> pa.RecordBatch:
    """The decoded ``rows``, with topic, partition, offset and time of the ``source`` rows
    they come from (``src``; None: one row per source row)."""
    taking = None if src is None else pa.array(src, pa.int64())

    def taken(column: pa.Array) -> pa.Array:
        return column if taking is None else column.take(taking)

    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [()] * len(_ROW_TYPES)
    decoded = [pa.array(c, t) for c, t in zip(columns, _ROW_TYPES, strict=True)]
    return pa.RecordBatch.from_arrays(
        [
            taken(source.column("topic")),
            taken(source.column("partition")),
            taken(source.column("offset")),
            decoded[0],
            taken(_timestamps_ms(source.column("timestamp"))),
            *decoded[1:],
        ],
        schema=_REQUEST_ARROW,
    )


def decode_events(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: `timer-events` rows → :data:`EVENT_SCHEMA` rows.

    One row per event: a ``TimerEventBatch`` record (``kt-kind: batch``, as the worker
    writes them) gives a row for each of its events, a lone ``TimerEvent`` record one.
    A record that is neither becomes one row of kind ``UNDECODABLE`` (``TOMBSTONE``
    without a value), counted, never fatal.
    """
    # Kind names by number in a dict (cheaper than Kind.Name, which still says why a number is unknown).
    known = {number: TimerEvent.Kind.Name(number) for number in TimerEvent.Kind.values()}
    name = TimerEvent.Kind.Name
    parse_one = TimerEvent.FromString
    parse_batch = TimerEventBatch.FromString
    for batch in batches:
        rows: list[tuple[Any, ...]] = []
        kinds = _kind_headers(batch.column("headers"))
        for value, record_kind in zip(batch.column("value").to_pylist(), kinds, strict=True):
            if value is None:
                rows.append((None, EVENT_TOMBSTONE, None, None, None, None, None))
                continue
            try:
                events = parse_batch(value).events if record_kind == KIND_BATCH else (parse_one(value),)
                decoded = [
                    (
                        e.id,
                        known.get(e.kind) or name(e.kind),
                        e.partition,
                        e.source_offset,
                        e.due_ms,
                        e.at_ms,
                        e.reason,
                    )
                    for e in events
                ]
            except Exception as exc:  # noqa: BLE001 - DecodeError, or an unknown enum value
                rows.append((None, UNDECODABLE, None, None, None, None, f"{exc.__class__.__name__}: {exc}"))
                continue
            rows.extend(decoded)
        columns: list[Any] = list(zip(*rows, strict=True)) if rows else [()] * len(_EVENT_ARROW)
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, _EVENT_ARROW, strict=True)], schema=_EVENT_ARROW
        )
