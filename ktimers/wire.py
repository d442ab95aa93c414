"""Wire format: message types, record headers and key codecs.

The schema itself lives in ``proto/timers.proto``; ``timers_pb2`` is generated
from it by ``make proto`` and checked in sync by a test.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from google.protobuf.message import DecodeError, Message

from ktimers.timers_pb2 import (
    Cancel,
    FiredTimers,
    Future,
    FutureBatch,
    Header,
    Recurrence,
    ScheduledTimers,
    StoredTimer,
    Tick,
    TimerEvent,
    TimerEventBatch,
)

__all__ = [
    "Cancel",
    "FiredTimers",
    "Future",
    "FutureBatch",
    "Header",
    "Recurrence",
    "ScheduledTimers",
    "StoredTimer",
    "Tick",
    "TimerEvent",
    "TimerEventBatch",
    "KIND_HEADER",
    "KIND_CANCEL",
    "KIND_FUTURE",
    "KIND_BATCH",
    "IDS_HEADER",
    "IDS_NEW",
    "REQUEST_MESSAGES",
    "H_ID",
    "H_DUE_MS",
    "H_TOKEN",
    "H_FIRED_MS",
    "H_OCCURRENCE",
    "H_REASON",
    "H_ERROR",
    "H_SOURCE_TOPIC",
    "H_SOURCE_PARTITION",
    "H_SOURCE_OFFSET",
    "H_SOURCE_INDEX",
    "H_INVALID_COUNT",
    "H_ELEMENT_COUNT",
    "KafkaHeaders",
    "MAX_ID_BYTES",
    "header_value",
    "message_headers",
    "encode_second_key",
    "parse_second_key",
    "decode_tick",
    "decode_events",
    "fired_columns",
    "event_batch_key",
    "UNNAMED_SOURCE",
    "callback_header_values",
    "callback_headers",
    "lay_out_callback_headers",
    "occurrence_headers",
    "ordinal_of",
    "timer_key",
    "split_timer_key",
    "due_prefix",
]

# Record header on `timer-request` telling a Cancel from a Future. Absent means
# Future, so seed producers (which send no headers) keep working.
KIND_HEADER = "kt-kind"
KIND_FUTURE = b"future"
KIND_CANCEL = b"cancel"
# A FutureBatch: many Futures in one record, all held by the record's partition.
# On `timer-events`: a TimerEventBatch.
KIND_BATCH = b"batch"
# Record header on `timer-request`: "every timer id in this record is new", drawn for this
# request by its producer (the client's random ids) and never used before. The worker then
# skips looking the ids up in its id index, where a new id finds nothing; a timer under it
# whose id is in use may be stored beside the pending one, not in its place.
IDS_HEADER = "kt-ids"
IDS_NEW = b"new"
#: The message each ``kt-kind`` of a request topic names (what the client frames for the Schema
#: Registry, and what a framed record's message index means to the worker).
REQUEST_MESSAGES: dict[bytes, type[Message]] = {
    KIND_FUTURE: Future,
    KIND_BATCH: FutureBatch,
    KIND_CANCEL: Cancel,
}

# Headers the worker adds to every callback record.
H_ID = "kt-id"  # timer id: receivers drop repeats by it
H_DUE_MS = "kt-due-ms"  # due time, epoch ms, decimal
H_TOKEN = "kt-token"  # noqa: S105 - a header name, not a secret
H_FIRED_MS = "kt-fired-ms"  # worker clock at dispatch, epoch ms, decimal
# ... and to each occurrence of a recurring timer: its ordinal (1 for the first), decimal.
H_OCCURRENCE = "kt-occurrence"

# Headers on dead-letter records.
H_REASON = "kt-reason"  # machine-readable reason code, e.g. "undecodable"
H_ERROR = "kt-error"  # human-readable detail
H_SOURCE_TOPIC = "kt-source-topic"
H_SOURCE_PARTITION = "kt-source-partition"
H_SOURCE_OFFSET = "kt-source-offset"
# Position of the rejected Future inside a FutureBatch record (0-based).
H_SOURCE_INDEX = "kt-source-index"
# On a `batch-invalid` dead letter (the whole FutureBatch record): refused Futures, and all of them.
H_INVALID_COUNT = "kt-invalid-count"
H_ELEMENT_COUNT = "kt-element-count"

KafkaHeaders = Sequence[tuple[str, bytes | None]]

#: Longest timer id accepted (UTF-8 bytes): ids are part of every table key and event key.
MAX_ID_BYTES = 512

_DUE = struct.Struct(">Q")


def header_value(headers: Iterable[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    """Return the last value of header ``name`` (Kafka allows repeats), or None."""
    found = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found


# For a header key that is not UTF-8, confluent-kafka's ``Message.headers()`` returns
# a broken list with an exception pending: a call from Python bytecode may not
# notice, a call from C raises SystemError. So it is called from C, once.
_read_headers = operator.methodcaller("headers")


def message_headers(msg: Any) -> tuple[tuple[str, bytes | None], ...] | None:
    """A consumed confluent-kafka message's headers; None when a header key is not UTF-8 (unreadable)."""
    try:
        raw = _read_headers(msg) or ()
    except Exception:  # noqa: BLE001 - SystemError, as explained above; nothing else is expected
        return None
    return tuple(cast(KafkaHeaders, raw))


def text_or_repr(data: bytes | None) -> str | None:
    """Bytes as text for people: UTF-8 when it is, else the bytes' repr."""
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return repr(data)


def encode_second_key(second: int) -> bytes:
    """Record key for an epoch second (seed format and ticks): decimal UTF-8."""
    return str(second).encode()


def parse_second_key(key: bytes | None) -> int | None:
    """Epoch second from a decimal key, or None when the key is not one."""
    if not key or len(key) > 12 or not key.isdigit():
        return None
    return int(key)


#: The source of a tick that names none (the seed format: a decimal key, no value).
UNNAMED_SOURCE = "(unnamed)"


def decode_tick(key: bytes | None, value: bytes | None) -> tuple[int | None, str]:
    """(epoch second, oscillator name) a tick record announces.

    The second is the ``Tick`` value's, else the decimal key's (seed format);
    None when neither is one. The name is ``Tick.source``, else :data:`UNNAMED_SOURCE`.
    """
    tick = None
    if value:
        try:
            tick = Tick.FromString(value)
        except Exception:  # noqa: BLE001 - any undecodable value falls back to the key
            tick = None
    if tick is not None and tick.second > 0:
        second: int | None = int(tick.second)
    else:
        second = parse_second_key(key)
    return second, (tick.source if tick is not None and tick.source else UNNAMED_SOURCE)


def event_batch_key(partition: int) -> bytes:
    """Key of the `timer-events` batch records of `timer-request` partition ``partition``."""
    return str(partition).encode()


def decode_events(
    value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None
) -> list[TimerEvent]:
    """The events of one `timer-events` record, in order: a ``TimerEventBatch``
    (``kt-kind: batch``, as the worker writes them; see :func:`batch_parts` for its order)
    or one ``TimerEvent``.

    Raises ``google.protobuf.message.DecodeError`` for a value that is neither.
    """
    if header_value(headers, KIND_HEADER) != KIND_BATCH:
        return [TimerEvent.FromString(value or b"")]
    events: list[TimerEvent] = []
    for part in batch_parts(TimerEventBatch.FromString(value or b"")):
        if isinstance(part, TimerEvent):
            events.append(part)
            continue
        if isinstance(part, ScheduledTimers):
            kind, rows = TimerEvent.SCHEDULED, scheduled_columns(part)
        else:  # a FIRED event names no callback topic
            kind, rows = TimerEvent.FIRED, ((*row, "") for row in fired_columns(part))
        events.extend(
            TimerEvent(
                id=timer_id,
                kind=kind,
                due_ms=due_ms,
                at_ms=part.at_ms,
                partition=part.partition,
                source_offset=source_offset,
                callback_topic=topic,
            )
            for timer_id, due_ms, source_offset, topic in rows
        )
    return events


#: A part of a ``TimerEventBatch``: one event, or a block of events column by column.
BatchPart = TimerEvent | ScheduledTimers | FiredTimers


def batch_parts(batch: TimerEventBatch) -> list[BatchPart]:
    """The parts of ``batch`` in the order their events happened: its ``events``, each
    ``ScheduledTimers`` block just before the event at its ``at_event`` (after them all when
    that is past the end), then its ``FiredTimers`` blocks."""
    events = batch.events
    # Stable: blocks at one place keep their order.
    places = sorted(batch.scheduled, key=lambda block: min(max(block.at_event, 0), len(events)))
    parts: list[BatchPart] = []
    at = 0
    for index, event in enumerate(events):
        while at < len(places) and places[at].at_event <= index:
            parts.append(places[at])
            at += 1
        parts.append(event)
    parts.extend(places[at:])
    parts.extend(batch.fired)
    return parts


def _columns(block: FiredTimers | ScheduledTimers, names: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
    """The rows of a block's equally long columns ``names``; ``DecodeError`` where they are not
    (a block not written by a worker)."""
    columns = [getattr(block, name) for name in names]
    if len({len(column) for column in columns}) > 1:
        lengths = ", ".join(f"{len(column)} {name}" for name, column in zip(names, columns, strict=True))
        raise DecodeError(f"{type(block).__name__} columns differ in length: {lengths}")
    return zip(*columns, strict=True)


def fired_columns(block: FiredTimers) -> Iterator[tuple[str, int, int]]:
    """(id, due_ms, source_offset) of each timer of a ``FiredTimers`` block, in order.

    Raises ``DecodeError`` when its columns are not equally long (not written by a worker).
    """
    return _columns(block, FIRED_COLUMNS)


def scheduled_columns(block: ScheduledTimers) -> Iterator[tuple[str, int, int, str]]:
    """(id, due_ms, source_offset, callback_topic) of each timer of a ``ScheduledTimers`` block,
    in order.

    Raises ``DecodeError`` when its columns are not equally long (not written by a worker).
    """
    return _columns(block, SCHEDULED_COLUMNS)


#: The columns of a ``FiredTimers`` and of a ``ScheduledTimers`` block, one entry per timer each.
FIRED_COLUMNS = ("id", "due_ms", "source_offset")
SCHEDULED_COLUMNS = ("id", "due_ms", "source_offset", "callback_topic")


def callback_headers(timer: StoredTimer, fired: bytes) -> list[tuple[str, str | bytes | None]]:
    """Headers of a timer's callback record: the user's, then ours (``fired``: the dispatch
    time, epoch ms in decimal, as ``kt-fired-ms`` carries it), ``kt-occurrence`` included for an
    occurrence of a series. See :func:`lay_out_callback_headers`."""
    own, timer_id, due, token = callback_header_values(timer)
    _, own = occurrence_headers(timer, own)
    return lay_out_callback_headers(own, timer_id, due, token, fired)


def callback_header_values(
    timer: StoredTimer,
) -> tuple[tuple[tuple[str, bytes | None], ...], bytes, bytes, bytes]:
    """What :func:`lay_out_callback_headers` takes besides the dispatch time: the user's headers,
    the id, the due time and the token, as header values."""
    future = timer.future
    own = future.headers
    return (
        tuple((h.key, h.value) for h in own) if own else (),
        future.id.encode(),
        str(future.due_ms).encode(),
        future.token.encode(),
    )


def ordinal_of(recurrence: Recurrence) -> int:
    """The ordinal of the occurrence a recurrence's timer holds (1 for the first)."""
    return max(recurrence.ordinal, 1)


def occurrence_headers(
    timer: StoredTimer, own: tuple[tuple[str, bytes | None], ...]
) -> tuple[int, tuple[tuple[str, bytes | None], ...]]:
    """A callback's ordinal (0 when ``timer`` is no series) and its headers before ``kt-id``:
    ``own`` (the user's), then ``kt-occurrence`` for an occurrence of a series — after every
    user header, so a reader taking a header's last value cannot be fooled by one."""
    future = timer.future
    if not future.HasField("recurrence"):
        return 0, own
    ordinal = ordinal_of(future.recurrence)
    return ordinal, (*own, (H_OCCURRENCE, str(ordinal).encode()))


def lay_out_callback_headers(
    own: tuple[tuple[str, bytes | None], ...], timer_id: bytes, due: bytes, token: bytes, fired: bytes
) -> list[tuple[str, str | bytes | None]]:
    """A callback's headers from their values: the user's (``own``), then ours — ``kt-id``,
    ``kt-due-ms``, ``kt-token`` when there is one, ``kt-fired-ms``.

    Ours come last, and readers take the last value of a repeated header, so a
    user header cannot forge them (the client also refuses ``kt-*`` names).
    Runs once per fired timer: most timers carry no headers and no token.
    """
    if not own and not token:
        return [(H_ID, timer_id), (H_DUE_MS, due), (H_FIRED_MS, fired)]
    headers: list[tuple[str, str | bytes | None]] = [*own, (H_ID, timer_id), (H_DUE_MS, due)]
    if token:
        headers.append((H_TOKEN, token))
    headers.append((H_FIRED_MS, fired))
    return headers


def timer_key(due_ms: int, timer_id: str) -> bytes:
    """Table key of a pending timer: 8-byte big-endian due ms, then the id.

    RocksDB orders keys bytewise, so keys iterate in due order and the timers
    due by a second are one forward range scan from the start.
    """
    return _DUE.pack(due_ms) + timer_id.encode()


def split_timer_key(key: bytes) -> tuple[int, str]:
    """Inverse of :func:`timer_key`: (due epoch ms, timer id)."""
    return _DUE.unpack_from(key)[0], key[_DUE.size :].decode()


def due_prefix(due_ms: int) -> bytes:
    """The smallest table key due at ``due_ms``; scan bound for "due before"."""
    return _DUE.pack(due_ms)
