"""The service's own records as people read them: ``timer-events``, dead letters and requests.

``timers watch`` prints these instead of protobuf bytes. Every function takes what a consumer
hands over (bytes or None, headers that may be anything) and returns JSON-ready dicts; a record
that does not decode keeps its raw value beside a ``decode_error``, it never raises.
Times are epoch milliseconds (``*_ms``), with an ISO 8601 copy for people.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import Enum
from typing import Any

from google.protobuf.message import DecodeError, Message

from ktimers.config import TopicsConfig
from ktimers.deadletter import H_ORIGINAL_SIZE, H_TRUNCATED
from ktimers.wire import (
    H_ELEMENT_COUNT,
    H_ERROR,
    H_INVALID_COUNT,
    H_REASON,
    H_SOURCE_INDEX,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    KIND_BATCH,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    Cancel,
    Future,
    FutureBatch,
    KafkaHeaders,
    TimerEvent,
    decode_events,
    header_value,
    text_or_repr,
)

Json = dict[str, Any]

#: Headers the worker adds to a rejected record: a dead letter without them is the record as sent.
DEAD_LETTER_HEADERS = frozenset(
    {
        H_REASON,
        H_ERROR,
        H_SOURCE_TOPIC,
        H_SOURCE_PARTITION,
        H_SOURCE_OFFSET,
        H_SOURCE_INDEX,
        H_INVALID_COUNT,
        H_ELEMENT_COUNT,
        H_TRUNCATED,
        H_ORIGINAL_SIZE,
    }
)
#: Latest epoch milliseconds shown as a date (the end of year 9999); beyond, only the number.
_MAX_DATE_MS = 253402300799999


class RecordKind(Enum):
    """What a record of a watched topic is."""

    EVENTS = "events"
    DEAD_LETTER = "dead-letter"
    REQUEST = "request"
    OTHER = "other"


def kind_of(topic: str, topics: TopicsConfig, headers: KafkaHeaders) -> RecordKind:
    """By the topic's name (the service's topics, as configured), else by content: a record
    with ``kt-reason`` is a dead letter, wherever it was copied to."""
    if topic == topics.dlq or header_value(headers, H_REASON) is not None:
        return RecordKind.DEAD_LETTER
    if topic == topics.events:
        return RecordKind.EVENTS
    if topic == topics.request:
        return RecordKind.REQUEST
    return RecordKind.OTHER


def iso_ms(epoch_ms: int) -> str | None:
    """``2026-11-21T17:00:00.250Z``; None outside years 1970 to 9999."""
    if not 0 <= epoch_ms <= _MAX_DATE_MS:
        return None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_ms // 1000))
    return f"{stamp}.{epoch_ms % 1000:03d}Z"


def kind_name(kind: int) -> str:
    """``CANCELLED``; the number, as text, for a kind this version does not know."""
    try:
        return TimerEvent.Kind.Name(kind)
    except ValueError:
        return str(kind)


def event_json(event: TimerEvent) -> Json:
    """One state change of a timer (see docs/wire.md#timer-events)."""
    out: Json = {
        "event": kind_name(event.kind),
        "id": event.id,
        "due_ms": event.due_ms or None,
        "due": iso_ms(event.due_ms) if event.due_ms else None,
        "at_ms": event.at_ms,
        "at": iso_ms(event.at_ms),
        "request_partition": event.partition,
        "source_offset": event.source_offset,
    }
    if event.reason:
        out["reason"] = event.reason
    if event.callback_topic:
        out["callback_topic"] = event.callback_topic
    return out


def events_of(value: bytes | None, headers: KafkaHeaders) -> list[TimerEvent]:
    """The events of one ``timer-events`` record; ``ValueError`` when it holds none that decode."""
    try:
        return decode_events(value, headers)
    except (DecodeError, RuntimeWarning) as exc:
        raise ValueError(f"not a TimerEvent or TimerEventBatch: {exc}") from exc


def future_json(future: Future) -> Json:
    """A timer request as sent. The token is the receiver's secret: only whether there is one."""
    out: Json = {
        "id": future.id,
        "callback_topic": future.callBackTopic,
        "callback_key": future.callBackKey,
        "payload": text_or_repr(future.callBack),
        "due_ms": future.due_ms if future.HasField("due_ms") else None,
        "due": iso_ms(future.due_ms) if future.HasField("due_ms") else None,
        "has_token": bool(future.token),
        "headers": {h.key: text_or_repr(h.value) for h in future.headers},
    }
    if future.HasField("recurrence"):
        r = future.recurrence
        out["recurrence"] = {
            "cron": r.cron or None,
            "time_zone": r.time_zone or None,
            "interval_ms": r.interval_ms or None,
            "until_ms": r.until_ms if r.HasField("until_ms") else None,
            "max_count": r.max_count or None,
            "ordinal": r.ordinal or None,
            "first_due_ms": r.first_due_ms or None,
        }
    return out


def _parse(message: type[Message], value: bytes | None) -> Any:
    try:
        return message.FromString(value or b"")
    except (DecodeError, RuntimeWarning) as exc:
        raise ValueError(f"not a {message.__name__}: {exc}") from exc


def request_json(value: bytes | None, headers: KafkaHeaders) -> Json:
    """A ``timer-request`` record by its ``kt-kind``; ``ValueError`` when it is not one."""
    kind = header_value(headers, KIND_HEADER)
    if kind == KIND_CANCEL:
        return {"kind": "cancel", "id": _parse(Cancel, value).id}
    if kind == KIND_BATCH:
        batch = _parse(FutureBatch, value)
        return {"kind": "batch", "timers": [future_json(f) for f in batch.futures]}
    if kind not in (None, KIND_FUTURE):
        raise ValueError(f"unknown kt-kind {text_or_repr(kind)!r}")
    return {"kind": "future", **future_json(_parse(Future, value))}


def _int(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None and len(raw) <= 20 else None
    except ValueError:
        return None


def _text(headers: KafkaHeaders, name: str) -> str | None:
    return text_or_repr(header_value(headers, name))


def original_headers(headers: KafkaHeaders) -> list[tuple[str, bytes | None]]:
    """The headers of the rejected record as it was sent: the dead letter's, less the worker's."""
    return [(k, v) for k, v in headers if k not in DEAD_LETTER_HEADERS]


def dead_letter_json(value: bytes | None, headers: KafkaHeaders) -> Json:
    """Why a record was rejected, where it came from, and the request it held (decoded when it
    decodes; else ``value`` and ``decode_error``). ``truncated``: what the worker cut to fit."""
    truncated = _text(headers, H_TRUNCATED)
    out: Json = {
        "reason": _text(headers, H_REASON),
        "error": _text(headers, H_ERROR),
        "source": {
            "topic": _text(headers, H_SOURCE_TOPIC),
            "partition": _int(header_value(headers, H_SOURCE_PARTITION)),
            "offset": _int(header_value(headers, H_SOURCE_OFFSET)),
        },
        "truncated": truncated.split(",") if truncated else [],
    }
    try:
        out["request"] = request_json(value, original_headers(headers))
    except ValueError as exc:
        out["value"] = text_or_repr(value)
        out["decode_error"] = str(exc)
    return out


def header_json(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str | None]:
    return {k: text_or_repr(v) for k, v in headers}
