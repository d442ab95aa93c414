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

import pyarrow as pa

from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, Rejection, RequestParser, Schedule
from ktimers.wire import TimerEvent

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


def _timestamps_ms(batch: pa.RecordBatch) -> list[int | None]:
    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    return [None if us is None else us // 1000 for us in micros]


@dataclass(frozen=True)
class RequestDecoder:
    """``mapInArrow`` function: Kafka rows (:data:`~futures.jobs.kafka_source.SOURCE_SCHEMA`)
    of any request topic → :data:`REQUEST_SCHEMA` rows, one per request a record holds."""

    limits: ParseLimits

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.decode(batch)

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        out: dict[str, list[Any]] = {name: [] for name in _REQUEST_ARROW.names}
        topics = batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        headers = batch.column("headers").to_pylist()
        stamps = _timestamps_ms(batch)
        # The worker clock at ingest only matters to a format that counts from
        # "now" when a record has no timestamp (the rest use the record's time),
        # so one parser, at the job's clock, serves the whole batch (it is what
        # parse_record builds per record, and costs 40 % of the decoding).
        parser = RequestParser(self.limits, time.time_ns() // 1_000_000)
        for i in range(batch.num_rows):
            stamp = stamps[i]
            record = SourceRecord(
                topic=topics[i],
                partition=partitions[i],
                offset=offsets[i],
                key=keys[i],
                value=values[i],
                headers=tuple((h["key"], h["value"]) for h in headers[i] or ()),
                timestamp_ms=-1 if stamp is None else stamp,
            )
            for idx, request in enumerate(parser.parse(record)):
                if isinstance(request, Schedule):
                    future = request.timer.future
                    _append(
                        out, record, idx, SCHEDULE, request.timer_id, request.due_ms,
                        future.callBackTopic, future.SerializeToString(),
                    )  # fmt: skip
                elif isinstance(request, CancelRequest):
                    _append(out, record, idx, CANCEL, request.timer_id)
                elif isinstance(request, Rejection):
                    # A tombstone is counted as such, whatever the format calls it.
                    reason = TOMBSTONE if record.value is None else request.reason
                    _append(out, record, idx, INVALID, request.timer_id or None, reason=reason)
        return pa.RecordBatch.from_pydict(out, schema=_REQUEST_ARROW)


def _append(
    out: dict[str, list[Any]],
    record: SourceRecord,
    idx: int,
    kind: str,
    timer_id: str | None = None,
    due_ms: int | None = None,
    callback_topic: str | None = None,
    future: bytes | None = None,
    reason: str | None = None,
) -> None:
    out["topic"].append(record.topic)
    out["partition"].append(record.partition)
    out["offset"].append(record.offset)
    out["idx"].append(idx)
    out["timestamp_ms"].append(record.timestamp_ms)
    out["kind"].append(kind)
    out["timer_id"].append(timer_id)
    out["due_ms"].append(due_ms)
    out["callback_topic"].append(callback_topic)
    out["future"].append(future)
    out["reason"].append(reason)


def decode_events(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: `timer-events` rows → :data:`EVENT_SCHEMA` rows.

    A record that is not a TimerEvent becomes one row of kind ``UNDECODABLE``
    (``TOMBSTONE`` without a value), counted, never fatal.
    """
    names = TimerEvent.Kind.Name
    for batch in batches:
        out: dict[str, list[Any]] = {name: [] for name in _EVENT_ARROW.names}
        for value in batch.column("value").to_pylist():
            row: tuple[Any, ...]
            if value is None:
                row = (None, EVENT_TOMBSTONE, None, None, None, None, None)
            else:
                try:
                    e = TimerEvent.FromString(value)
                    row = (e.id, names(e.kind), e.partition, e.source_offset, e.due_ms, e.at_ms, e.reason)
                except Exception as exc:  # noqa: BLE001 - DecodeError, or an unknown enum value
                    row = (None, UNDECODABLE, None, None, None, None, f"{exc.__class__.__name__}: {exc}")
            for name, cell in zip(_EVENT_ARROW.names, row, strict=True):
                out[name].append(cell)
        yield pa.RecordBatch.from_pydict(out, schema=_EVENT_ARROW)
