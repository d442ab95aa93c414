"""Native request records decoded into columns: a ``FutureBatch``'s timers without an object each.

The general parser (:mod:`futures.ingress.native`) turns every timer into a
``StoredTimer`` message and a ``Schedule``, and the engine serialises it again:
about half of what a timer cost at ingest. :func:`decode` reads a native record
that holds only valid timers — a ``Future`` or a ``FutureBatch`` — straight into
columns (ids, due times, callback topics, ``StoredTimer`` bytes) for
:class:`~futures.worker.ingest.Ingest` to stage. Anything else — a cancel, framed
records, a seed-format ``Future`` without ``due_ms``, a timer the checks refuse —
returns None, and the record takes the general parser, which decides what it
means and writes the dead letters: this module never rejects. So does a recurring
timer, whose recurrence the worker checks on that path (:mod:`futures.worker.series`).

The checks are the general parser's (:meth:`ParseContext.timer_problem`), made once
per record and callback topic: each check is monotone in the id's length and in the
due time, so a record's timers all pass exactly when its longest id, earliest and
latest due times pass with each of its callback topics.

Protobuf fields concatenate: a ``StoredTimer``'s bytes are its field 1 (the
normalised ``Future``, length-delimited) followed by its other fields, which are the
same for every timer of a record. So each timer's stored bytes are one serialise of
its ``Future`` and a concatenation, equal to ``StoredTimer.SerializeToString()``
(tests/worker/test_columns.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from google.protobuf.message import DecodeError

from futures.ingress.base import TABLE_KEY_OVERHEAD, ParseContext
from futures.ingress.framing import is_framed
from futures.ingress.records import SourceRecord
from ktimers.wire import KIND_BATCH, KIND_FUTURE, KIND_HEADER, Future, FutureBatch, StoredTimer, header_value

#: The tag of ``StoredTimer.future`` (field 1, length-delimited).
_FUTURE_TAG = b"\n"
#: The tag of ``StoredTimer.source_offset`` (field 3, a varint).
_SOURCE_OFFSET_TAG = b"\x18"


class Timers(NamedTuple):
    """The valid timers of one request record, column by column (the i-th timer is ``ids[i]``, ...)."""

    record: SourceRecord
    ids: list[str]
    #: The ids UTF-8 encoded (what table keys hold).
    id_bytes: list[bytes]
    due_ms: list[int]  # epoch ms
    callback_topics: list[str]
    #: ``StoredTimer`` bytes: what the table holds for each timer.
    stored: list[bytes]


class Decoder:
    """Decodes the records of one batch (:func:`decode`), with what they share computed once."""

    def __init__(self, context: ParseContext) -> None:
        self._context = context
        #: Largest stored timer and id together (bytes): what fits ``TIMERS_MAX_PAYLOAD_BYTES``.
        self._room = context.limits.max_payload_bytes - TABLE_KEY_OVERHEAD
        #: (topic, partition) → the StoredTimer fields before and after ``source_offset``.
        self._tails: dict[tuple[str, int], tuple[bytes, bytes]] = {}

    def _tail(self, record: SourceRecord) -> bytes:
        """A StoredTimer's fields but its ``future``, for the timers of ``record``."""
        parts = self._tails.get((record.topic, record.partition))
        if parts is None:
            before = StoredTimer(source_partition=record.partition).SerializeToString()
            after = StoredTimer(
                accepted_ms=self._context.now_ms, source_topic=record.topic
            ).SerializeToString()
            parts = self._tails[record.topic, record.partition] = (before, after)
        offset = record.offset
        if offset <= 0:  # 0 is the field's default, left out; no offset is negative
            return parts[0] + StoredTimer(source_offset=offset).SerializeToString() + parts[1]
        # Encoded by hand: a protobuf message built per record costs more than the varint.
        return parts[0] + _SOURCE_OFFSET_TAG + _varint(offset) + parts[1]

    def decode(self, record: SourceRecord) -> Timers | None:
        """The timers of native ``record`` as columns if every one of them is valid; None otherwise
        (the general parser then decides: see the module docstring)."""
        value = record.value
        if not value or is_framed(value):
            return None
        kind = header_value(record.headers, KIND_HEADER)
        try:
            if kind is None or kind == KIND_FUTURE:
                return self._single(record, Future.FromString(value))
            if kind == KIND_BATCH:
                return self._batch(record, FutureBatch.FromString(value).futures)
        except DecodeError:
            pass
        return None

    def _single(self, record: SourceRecord, future: Future) -> Timers | None:
        timer_id = future.id
        if not timer_id:
            timer_id = future.id = self._context.derived_id(record)
        if not future.HasField("due_ms") or future.HasField("recurrence"):
            return None  # the seed format (the due second is in the key), or a series to check
        encoded = timer_id.encode()
        stored = _stored(future.SerializeToString(), self._tail(record))
        due_ms, topic = future.due_ms, future.callBackTopic
        if len(stored) + len(encoded) > self._room:
            return None
        if self._context.timer_problem(len(encoded), due_ms, topic, record.topic) is not None:
            return None
        return Timers(record, [timer_id], [encoded], [due_ms], [topic], [stored])

    def _batch(self, record: SourceRecord, futures: Iterable[Future]) -> Timers | None:
        context = self._context
        tail = self._tail(record)
        ids: list[str] = []
        id_bytes: list[bytes] = []
        dues: list[int] = []
        topics: list[str] = []
        stored: list[bytes] = []
        longest = 0
        largest = 0  # stored bytes and id bytes, of the largest timer
        for index, future in enumerate(futures):
            timer_id = future.id
            if not timer_id:
                timer_id = future.id = context.derived_id(record, index)
            if not future.HasField("due_ms") or future.HasField("recurrence"):
                return None  # refused in a batch (every timer says when), or a series to check
            encoded = timer_id.encode()
            size = len(encoded)
            if size > longest:
                longest = size
            timer = _stored(future.SerializeToString(), tail)
            size += len(timer)
            if size > largest:
                largest = size
            ids.append(timer_id)
            id_bytes.append(encoded)
            dues.append(future.due_ms)
            topics.append(future.callBackTopic)
            stored.append(timer)
        if not ids or largest > self._room:
            return None
        earliest, latest = min(dues), max(dues)
        for topic in set(topics):
            if context.timer_problem(longest, earliest, topic, record.topic) is not None:
                return None
            if latest != earliest and context.timer_problem(longest, latest, topic, record.topic) is not None:
                return None
        return Timers(record, ids, id_bytes, dues, topics, stored)


def decode(record: SourceRecord, context: ParseContext) -> Timers | None:
    """:meth:`Decoder.decode` of one record (a batch's records share a :class:`Decoder`)."""
    return Decoder(context).decode(record)


def _stored(future: bytes, tail: bytes) -> bytes:
    """A StoredTimer's bytes: its ``future`` field (tag, length as a varint, the Future) and the rest."""
    n = len(future)
    if n < 0x80:
        return _FUTURE_TAG + bytes((n,)) + future + tail
    if n < 0x4000:
        return _FUTURE_TAG + bytes(((n & 0x7F) | 0x80, n >> 7)) + future + tail
    return _FUTURE_TAG + _varint(n) + future + tail


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
