"""The etf1 kafka-message-scheduler format: a plain record, scheduled by its headers.

A schedule is a record on a schedules topic: key = schedule id, value = the
payload to deliver, headers ``scheduler-epoch`` (due, epoch **seconds**),
``scheduler-target-topic`` and ``scheduler-target-key``, plus any others.
A newer record with the same key replaces the schedule; a tombstone (null
value) deletes it. When it fires, the payload goes to the target topic with the
target key and every header of the schedule record, then ``scheduler-timestamp``
(the schedule record's timestamp, epoch seconds), ``scheduler-key`` and
``scheduler-topic`` — as the original scheduler sends them. Those output headers
are put in the Future's headers here, so the firing path needs no special case.

The timer id is ``<topic>:<key>``: schedules of different topics, or a native
timer with the same id, never replace each other.
"""

from __future__ import annotations

import re

from futures.ingress.base import MAX_ID_BYTES, CancelRequest, ParseContext, Rejection, Request, shown
from futures.ingress.records import SourceRecord
from ktimers.wire import Future, Header, header_value

H_EPOCH = "scheduler-epoch"
H_TARGET_TOPIC = "scheduler-target-topic"
H_TARGET_KEY = "scheduler-target-key"
# Added to the delivered record.
H_TIMESTAMP = "scheduler-timestamp"
H_KEY = "scheduler-key"
H_TOPIC = "scheduler-topic"

# Our own callback headers come last on the delivered record; copies arriving
# on a schedule are dropped so they cannot be mistaken for (or forge) ours.
_RESERVED_PREFIX = "kt-"
_EPOCH_SECONDS = re.compile(rb"[0-9]{1,12}")


def timer_id(record: SourceRecord, schedule_id: str) -> str:
    return f"{record.topic}:{schedule_id}"


def parse(record: SourceRecord, context: ParseContext) -> list[Request]:
    return [_parse(record, context)]


def _parse(record: SourceRecord, context: ParseContext) -> Request:
    if not record.key:
        return Rejection(record, "missing-id", "an etf1 schedule's record key is its id; this one has none")
    try:
        schedule_id = record.key.decode()
    except UnicodeDecodeError:
        return Rejection(record, "invalid-id", f"the record key {shown(record.key)} is not UTF-8 text")
    tid = timer_id(record, schedule_id)
    if len(tid.encode()) > MAX_ID_BYTES:
        # Checked before anything names the timer: such an id keys no table entry and no event.
        return Rejection(record, "invalid-id", f"timer id {shown(tid)} is longer than {MAX_ID_BYTES} bytes")
    if record.value is None:
        return CancelRequest(record, tid)
    headers = record.headers
    epoch = header_value(headers, H_EPOCH)
    if epoch is None:
        return Rejection(record, "missing-header", f"no {H_EPOCH} header (the due epoch second)", tid)
    if not _EPOCH_SECONDS.fullmatch(epoch):
        return Rejection(
            record, "bad-due-time", f"{H_EPOCH}={shown(epoch)} is not a non-negative epoch second", tid
        )
    target_topic = header_value(headers, H_TARGET_TOPIC)
    target_key = header_value(headers, H_TARGET_KEY)
    for name, value in ((H_TARGET_TOPIC, target_topic), (H_TARGET_KEY, target_key)):
        if value is None:
            return Rejection(record, "missing-header", f"no {name} header", tid)
    assert target_topic is not None and target_key is not None  # noqa: S101 - checked just above
    try:
        topic_text, key_text = target_topic.decode(), target_key.decode()
    except UnicodeDecodeError:
        return Rejection(
            record, "invalid-header", f"{H_TARGET_TOPIC} and {H_TARGET_KEY} must be UTF-8 text", tid
        )
    try:
        out_headers = [
            Header(key=name, value=value or b"")
            for name, value in headers
            if not name.startswith(_RESERVED_PREFIX)
        ]
    except ValueError:  # UnicodeEncodeError: a name that was not UTF-8 on the wire
        bad = next((name for name, _ in headers if not _is_text(name)), None)
        if bad is None:
            raise
        detail = f"header name {shown(bad)} is not UTF-8 text, so it cannot be carried to the callback"
        return Rejection(record, "invalid-header", detail, tid)
    out_headers += [
        Header(key=H_TIMESTAMP, value=str(max(record.timestamp_ms, 0) // 1000).encode()),
        Header(key=H_KEY, value=record.key),
        Header(key=H_TOPIC, value=record.topic.encode()),
    ]
    future = Future(
        callBackTopic=topic_text,
        callBackKey=key_text,
        callBack=record.value,
        id=tid,
        headers=out_headers,
    )
    return context.accept(record, future, int(epoch) * 1000)


def _is_text(name: str) -> bool:
    # The consumer decodes header names with surrogateescape: bytes that were
    # not UTF-8 come back as lone surrogates, which protobuf strings refuse.
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True
