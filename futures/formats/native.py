"""The native format of `timer-request`: a ``Future``, a ``Cancel`` or a ``FutureBatch``.

The record header ``kt-kind`` tells them apart (absent = ``Future``, so seed
producers that send bare Futures keyed by the due second keep working).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from futures.formats.base import CancelRequest, ParseContext, Rejection, Request
from futures.records import SourceRecord
from ktimers.wire import (
    H_SOURCE_INDEX,
    KIND_BATCH,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    Cancel,
    Future,
    FutureBatch,
    header_value,
    parse_second_key,
)


def parse(record: SourceRecord, context: ParseContext) -> list[Request]:
    kind = header_value(record.headers, KIND_HEADER)
    if kind == KIND_BATCH:
        return _parse_batch(record, context)
    if kind == KIND_CANCEL:
        return [_parse_cancel(record)]
    if kind not in (None, KIND_FUTURE):
        detail = f"{KIND_HEADER}={kind!r}: expected 'future', 'cancel' or 'batch'"
        return [Rejection(record, "unknown-kind", detail)]
    return [_parse_future(record, context)]


def _parse_cancel(record: SourceRecord) -> Request:
    try:
        cancel = Cancel.FromString(record.value or b"")
    except DecodeError as exc:
        return Rejection(record, "undecodable", f"not a Cancel message: {exc}")
    if not cancel.id:
        return Rejection(record, "missing-id", "a Cancel must name the timer id to cancel")
    return CancelRequest(record, cancel.id)


def _parse_future(record: SourceRecord, context: ParseContext) -> Request:
    if record.value is None:
        return Rejection(record, "undecodable", "tombstone (null value) on the request topic")
    try:
        future = Future.FromString(record.value)
    except DecodeError as exc:
        return Rejection(record, "undecodable", f"not a Future message: {exc}")
    if not future.id:
        future.id = context.derived_id(record)
    if future.HasField("due_ms"):
        due_ms = future.due_ms
    else:
        second = parse_second_key(record.key)
        if second is None:
            return Rejection(
                record,
                "bad-due-time",
                f"no due_ms field and the key {record.key!r} is not an epoch second",
                future.id,
            )
        due_ms = second * 1000
    return context.accept(record, future, due_ms)


def _parse_batch(record: SourceRecord, context: ParseContext) -> list[Request]:
    try:
        batch = FutureBatch.FromString(record.value or b"")
    except DecodeError as exc:
        return [Rejection(record, "undecodable", f"not a FutureBatch message: {exc}")]
    if not batch.futures:
        return [Rejection(record, "empty-batch", "a FutureBatch must hold at least one Future")]
    requests: list[Request] = []
    for index, future in enumerate(batch.futures):
        if not future.id:
            future.id = context.derived_id(record, index)
        if not future.HasField("due_ms"):
            # The record key is the batch's, not a due second: every timer says when.
            detail = "a Future in a FutureBatch must set due_ms"
            requests.append(Rejection(_single(record, future, index), "bad-due-time", detail, future.id))
            continue
        request = context.accept(record, future, future.due_ms)
        if isinstance(request, Rejection):
            # Dead-letter the one bad timer as a single Future record, which can
            # be fixed and resent on its own; the rest of the batch is scheduled.
            request = Rejection(_single(record, future, index), request.reason, request.detail, future.id)
        requests.append(request)
    return requests


def _single(record: SourceRecord, future: Future, index: int) -> SourceRecord:
    """The n-th timer of a batch as the single-Future record that would have requested it."""
    return SourceRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=future.id.encode(),
        value=future.SerializeToString(),
        headers=((KIND_HEADER, KIND_FUTURE), (H_SOURCE_INDEX, str(index).encode())),
        timestamp_ms=record.timestamp_ms,
    )
