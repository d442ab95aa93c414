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
:meth:`Decoder.decode_run` reads a partition's consecutive records so, together, up to
the first that takes the general parser: one ``Future`` per record costs about what a
timer of a batch does.

The checks are the general parser's (:meth:`ParseContext.timer_problem`), made once
per record, or run of records, and callback topic: each check is monotone in the id's
length and in the due time, so timers all pass exactly when their longest id, earliest
and latest due times pass with each of their callback topics.

Protobuf fields concatenate: a ``StoredTimer``'s bytes are its field 1 (the
``Future``, length-delimited) followed by its other fields, which are the same for
every timer of a record (:meth:`Decoder._tail`). So each timer's stored bytes are its
``Future``'s bytes as the record holds them and a concatenation; they read back as
the ``StoredTimer`` the general parser builds (tests/worker/test_columns.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from futures.ingress.base import TABLE_KEY_OVERHEAD, ParseContext
from futures.ingress.records import SourceRecord
from futures.worker.future_columns import read_records
from ktimers.wire import StoredTimer


@dataclass(slots=True)
class Timers:
    """Valid timers column by column (the i-th timer is ``ids[i]``, ...): those of one request
    record, or of consecutive records of one partition."""

    #: The record each timer came in.
    records: list[SourceRecord]
    ids: list[str]
    #: The ids UTF-8 encoded (what table keys hold).
    id_bytes: list[bytes]
    due_ms: list[int]  # epoch ms
    callback_topics: list[str]
    #: ``StoredTimer`` bytes: what the table holds for each timer.
    stored: list[bytes]
    #: Every id is new: its records say so (``kt-ids: new``), so none is looked up in the table.
    new_ids: bool = False

    def extend(self, more: Timers) -> None:
        """Append the timers of ``more`` (of records that come after these)."""
        self.records += more.records
        self.ids += more.ids
        self.id_bytes += more.id_bytes
        self.due_ms += more.due_ms
        self.callback_topics += more.callback_topics
        self.stored += more.stored
        self.new_ids = self.new_ids and more.new_ids


class Decoder:
    """Decodes the records of one batch (:func:`decode`), with what they share computed once."""

    def __init__(self, context: ParseContext) -> None:
        self._context = context
        #: Largest stored timer and id together (bytes): what fits ``TIMERS_MAX_PAYLOAD_BYTES``.
        self._room = context.limits.max_payload_bytes - TABLE_KEY_OVERHEAD
        #: (topic, partition) → the StoredTimer fields before and after ``source_offset``.
        self._tails: dict[tuple[str, int], tuple[bytes, bytes]] = {}
        #: (topic, partition) → the last offset of a run whose checks failed: the records up to
        #: it are decoded one at a time, so that no record is read more than three times however
        #: many refused timers are among them.
        self._alone: dict[tuple[str, int], int] = {}

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
        timers, _ = self._read([record], 1)
        return timers

    def decode_run(self, records: list[SourceRecord], max_timers: int) -> tuple[Timers | None, int]:
        """The timers of the first records of ``records`` (native, of one topic and partition, in
        order) as columns, as far as :meth:`decode` would take each of them and until
        ``max_timers`` are read, and how many records that is (0, and None: the first record
        takes the general parser).

        One compiled read and one set of checks for them all, where :meth:`decode` makes one each:
        a producer sending one ``Future`` per record pays them once per record.
        """
        first = records[0]
        if first.offset <= self._alone.get((first.topic, first.partition), -1):
            one = self.decode(first)
            return (None, 0) if one is None else (one, 1)
        timers, end = self._read(records, max_timers)
        if timers is not None:
            return timers, end
        if end <= 1:
            return None, 0  # the first record is the general parser's
        # A timer is refused: each record on its own, up to the first refused.
        self._alone[first.topic, first.partition] = records[end - 1].offset
        taken: Timers | None = None
        for count, record in enumerate(records[:end]):
            one = self.decode(record)
            if one is None:
                return taken, count
            if taken is None:
                taken = one
            else:
                taken.extend(one)
        return taken, end

    def _read(self, records: list[SourceRecord], max_timers: int) -> tuple[Timers | None, int]:
        """The timers of the first records of ``records`` that the compiled reader takes, and how
        many records those are; None (and that number) when a timer is refused, or (None, 0)."""
        first = records[0]
        read, end = read_records(records, max_timers, self._tail(first), self._context.derived_id)
        if read is None:
            return None, 0
        sources, ids, id_bytes, dues, topics, stored, longest, largest, new_ids = read
        timers = Timers(sources, ids, id_bytes, dues, topics, stored, new_ids)
        return (timers if self._valid(first.topic, timers, longest, largest) else None), end

    def _valid(self, request_topic: str, timers: Timers, longest: int, largest: int) -> bool:
        """Whether every one of ``timers`` passes the general parser's checks (the module docstring),
        given their longest id (bytes) and largest id and stored bytes together."""
        if largest > self._room:
            return False
        context = self._context
        earliest, latest = min(timers.due_ms), max(timers.due_ms)
        problem = context.timer_problem
        for topic in set(timers.callback_topics):
            if problem(longest, earliest, topic, request_topic) is not None:
                return False
            if latest != earliest and problem(longest, latest, topic, request_topic) is not None:
                return False
        return True


def decode(record: SourceRecord, context: ParseContext) -> Timers | None:
    """:meth:`Decoder.decode` of one record (a batch's records share a :class:`Decoder`)."""
    return Decoder(context).decode(record)
