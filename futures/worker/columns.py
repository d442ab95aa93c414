"""Native request records decoded into columns: a ``FutureBatch``'s timers without an object each.

The general parser (:mod:`futures.ingress.native`) turns every timer into a
``StoredTimer`` message and a ``Schedule``, and the engine serialises it again:
about half of what a timer cost at ingest. :func:`decode` reads a native record
that holds only valid timers — a ``Future`` or a ``FutureBatch`` — straight into
columns (ids, due times, callback topics, ``StoredTimer`` bytes) for
:class:`~futures.worker.ingest.Ingest` to stage: the reading is compiled
(:mod:`futures.worker.future_columns`), the decisions are here. Anything else — a cancel, framed
records, a seed-format ``Future`` without ``due_ms``, a timer the checks refuse —
returns None, and the record takes the general parser, which decides what it
means and writes the dead letters: this module never rejects. So does a recurring
timer, whose recurrence the worker checks on that path (:mod:`futures.worker.series`).

The checks are the general parser's (:meth:`ParseContext.timer_problem`), made once
per record and callback topic: each check is monotone in the id's length and in the
due time, so a record's timers all pass exactly when its longest id, earliest and
latest due times pass with each of its callback topics.

Protobuf fields concatenate: a ``StoredTimer``'s bytes are its field 1 (the
``Future``, length-delimited) followed by its other fields, which are the same for
every timer of a record (:meth:`Decoder._tail`). So each timer's stored bytes are its
``Future``'s bytes as the record holds them and a concatenation; they read back as
the ``StoredTimer`` the general parser builds (tests/worker/test_columns.py).
"""

from __future__ import annotations

from typing import NamedTuple

from futures.ingress.base import TABLE_KEY_OVERHEAD, ParseContext
from futures.ingress.framing import is_framed
from futures.ingress.records import SourceRecord
from futures.worker.future_columns import read_futures
from ktimers.wire import KIND_BATCH, KIND_FUTURE, KIND_HEADER, StoredTimer, header_value


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

    def _tail(self, record: SourceRecord) -> tuple[bytes, bytes]:
        """A StoredTimer's fields before and after ``source_offset`` (they follow its ``future``),
        for the timers of ``record``."""
        parts = self._tails.get((record.topic, record.partition))
        if parts is None:
            before = StoredTimer(source_partition=record.partition).SerializeToString()
            after = StoredTimer(
                accepted_ms=self._context.now_ms, source_topic=record.topic
            ).SerializeToString()
            parts = self._tails[record.topic, record.partition] = (before, after)
        return parts

    def decode(self, record: SourceRecord) -> Timers | None:
        """The timers of native ``record`` as columns if every one of them is valid; None otherwise
        (the general parser then decides: see the module docstring)."""
        value = record.value
        if not value or is_framed(value):
            return None
        kind = header_value(record.headers, KIND_HEADER)
        if kind is not None and kind != KIND_FUTURE and kind != KIND_BATCH:
            return None
        context = self._context
        tail = self._tail(record)
        read = read_futures(value, kind == KIND_BATCH, tail, record.offset, context.derived_id, record)
        if read is None:
            return None
        ids, id_bytes, dues, topics, stored, longest, largest = read
        if largest > self._room:
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
