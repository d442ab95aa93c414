"""The native format of `timer-request`: a ``Future``, a ``Cancel`` or a ``FutureBatch``.

A bare message: the record header ``kt-kind`` tells them apart (absent =
``Future``, so seed producers that send bare Futures keyed by the due second
keep working). A message in the Schema Registry wire format (its first byte is
0, which no protobuf message starts with): the message index tells them apart
(:mod:`futures.ingress.framing`) and ``kt-kind`` is ignored; with a registry
configured, the schema id is checked first (:mod:`futures.ingress.registry`).
"""

from __future__ import annotations

from collections import Counter

from google.protobuf.message import DecodeError

from futures.ingress.base import (
    MAX_ID_BYTES,
    CancelRequest,
    ParseContext,
    Rejection,
    Request,
    shown,
)
from futures.ingress.framing import REQUEST_KINDS, is_framed, unframe
from futures.ingress.records import SourceRecord
from ktimers.deadletter import short
from ktimers.wire import (
    H_ELEMENT_COUNT,
    H_INVALID_COUNT,
    H_SOURCE_INDEX,
    KIND_BATCH,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    REQUEST_MESSAGES,
    Cancel,
    Future,
    FutureBatch,
    header_value,
    parse_second_key,
)

#: A FutureBatch with more bad timers than this is dead-lettered as one record
#: (``batch-invalid``), so that one record never turns into a flood of dead letters and events.
MAX_REFUSED_PER_BATCH = 10


def parse(record: SourceRecord, context: ParseContext) -> list[Request]:
    value = record.value
    if is_framed(value):
        assert value is not None  # noqa: S101 - is_framed says so
        return _parse_framed(record, value, context)
    kind = header_value(record.headers, KIND_HEADER)
    if kind is not None and kind not in REQUEST_MESSAGES:
        detail = f"{KIND_HEADER}={shown(kind)}: expected 'future', 'cancel' or 'batch'"
        return [Rejection(record, "unknown-kind", detail)]
    return _parse_message(record, kind or KIND_FUTURE, value, context)


def _parse_message(
    record: SourceRecord, kind: bytes, value: bytes | None, context: ParseContext
) -> list[Request]:
    """``value`` (the record's, or the message inside its framing) parsed as the ``kind`` it is."""
    if kind == KIND_BATCH:
        return _parse_batch(record, value, context)
    if kind == KIND_CANCEL:
        return [_parse_cancel(record, value)]
    return [_parse_future(record, value, context)]


def _parse_framed(record: SourceRecord, value: bytes, context: ParseContext) -> list[Request]:
    framed = unframe(value)
    if isinstance(framed, str):
        return [Rejection(record, "undecodable", f"Schema Registry framing: {framed}")]
    kind = framed.kind
    if kind is None:
        detail = (
            f"schema id {framed.schema_id}, message index {short(framed.where(), 80)}: "
            f"proto/timers.proto's Future is {_INDEX[KIND_FUTURE]}, FutureBatch {_INDEX[KIND_BATCH]}, "
            f"Cancel {_INDEX[KIND_CANCEL]}"
        )
        return [Rejection(record, "unknown-message-index", detail)]
    schemas = context.limits.schemas
    problem = None if schemas is None else schemas.problem(framed)
    if problem is not None:
        return [Rejection(record, *problem)]
    return _parse_message(record, kind, framed.message, context)


#: The message index of each request kind, for details.
_INDEX = {kind: "[" + ", ".join(map(str, index)) + "]" for index, kind in REQUEST_KINDS.items()}


def _parse_cancel(record: SourceRecord, value: bytes | None) -> Request:
    named = cancel_id(value)
    if isinstance(named, str):
        return CancelRequest(record, named)
    return Rejection(record, *named)


def cancel_id(value: bytes | None) -> str | tuple[str, str]:
    """The timer id a Cancel record's value names, or why it is rejected: (reason, detail)."""
    try:
        cancel = Cancel.FromString(value or b"")
    except DecodeError as exc:
        return "undecodable", short(f"not a Cancel message: {exc}")
    if not cancel.id:
        return "missing-id", "a Cancel must name the timer id to cancel"
    if _too_long(cancel.id):
        # No timer has such an id, and it could not key the CANCEL_MISSED event.
        return "invalid-id", f"timer id longer than {MAX_ID_BYTES} bytes"
    return cancel.id


def fast_parse(
    kind: bytes | None, value: bytes | None, context: ParseContext, topic: str | None = None
) -> Future | str | None:
    """The common native records without the cost of :func:`parse`, for bulk readers (the Spark jobs).

    ``kind`` is the record's ``kt-kind`` header (its last value, :func:`header_value`),
    ``value`` its value, ``topic`` its topic (default: `timer-request`). Returns the
    normalised Future of a single-Future record that :func:`parse` would schedule
    (it names its id and due_ms), the timer id of a valid Cancel, or None: then
    :func:`parse` decides (rejections, batches, derived ids and due times, a
    payload limit to check, framed records). Where it answers, the answer is the
    one :func:`parse` gives (tests/ingress/test_fast_parse.py).
    """
    if is_framed(value):
        return None
    if kind == KIND_CANCEL:
        named = cancel_id(value)
        return named if isinstance(named, str) else None
    if (kind is not None and kind != KIND_FUTURE) or value is None or context.payload_limited:
        return None
    try:
        future = Future.FromString(value)
    except DecodeError:
        return None
    timer_id = future.id
    if not timer_id or not future.HasField("due_ms"):
        return None
    request_topic = context.request_topic if topic is None else topic
    if context.timer_problem(len(timer_id.encode()), future.due_ms, future.callBackTopic, request_topic):
        return None
    return future


def _too_long(timer_id: str) -> bool:
    return len(timer_id.encode()) > MAX_ID_BYTES


def _parse_future(record: SourceRecord, value: bytes | None, context: ParseContext) -> Request:
    if value is None:
        return Rejection(record, "undecodable", "tombstone (null value) on the request topic")
    try:
        future = Future.FromString(value)
    except DecodeError as exc:
        return Rejection(record, "undecodable", short(f"not a Future message: {exc}"))
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
                f"no due_ms field and the key {shown(record.key)} is not an epoch second",
                future.id,
            )
        due_ms = second * 1000
    return context.accept(record, future, due_ms)


def _parse_batch(record: SourceRecord, value: bytes | None, context: ParseContext) -> list[Request]:
    try:
        batch = FutureBatch.FromString(value or b"")
    except DecodeError as exc:
        return [Rejection(record, "undecodable", short(f"not a FutureBatch message: {exc}"))]
    if not batch.futures:
        return [Rejection(record, "empty-batch", "a FutureBatch must hold at least one Future")]
    requests: list[Request] = []
    refused: list[tuple[int, Future, str, str]] = []  # index, timer, reason, detail
    for index, future in enumerate(batch.futures):
        if not future.id:
            future.id = context.derived_id(record, index)
        if not future.HasField("due_ms"):
            # The record key is the batch's, not a due second: every timer says when.
            refused.append((index, future, "bad-due-time", "a Future in a FutureBatch must set due_ms"))
            continue
        request = context.accept(record, future, future.due_ms)
        if isinstance(request, Rejection):
            refused.append((index, future, request.reason, request.detail))
        else:
            requests.append(request)
    if len(refused) > MAX_REFUSED_PER_BATCH:
        requests.append(_batch_invalid(record, refused, len(batch.futures), context))
    else:
        # Dead-letter each bad timer as a single Future record, which can be
        # fixed and resent on its own; the rest of the batch is scheduled.
        requests += [_rejected(record, f, i, reason, detail, context) for i, f, reason, detail in refused]
    return requests


def _batch_invalid(
    record: SourceRecord, refused: list[tuple[int, Future, str, str]], elements: int, context: ParseContext
) -> Rejection:
    """One dead letter for a batch with many bad timers: the batch record, with counts by reason."""
    reasons = Counter(reason for _, _, reason, _ in refused)
    index, _, reason, detail = refused[0]
    by_reason = ", ".join(f"{name} x{count}" for name, count in reasons.most_common())
    summary = f"{len(refused)} of {elements} timers refused ({by_reason}); first, at index {index}: {detail}"
    counts = ((H_INVALID_COUNT, str(len(refused)).encode()), (H_ELEMENT_COUNT, str(elements).encode()))
    return Rejection(record, "batch-invalid", short(summary), context.derived_id(record), counts)


def _rejected(
    record: SourceRecord, future: Future, index: int, reason: str, detail: str, context: ParseContext
) -> Rejection:
    """The n-th timer of a batch, rejected: named by its id, or by its derived one if that is too long."""
    timer_id = context.derived_id(record, index) if _too_long(future.id) else future.id
    return Rejection(_single(record, future, index), reason, detail, timer_id)


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
