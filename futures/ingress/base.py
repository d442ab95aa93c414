"""What every ingress format turns a record into, and the checks every timer passes.

A format module is a pure function ``parse(record, context) -> list[Request]``:
no Kafka, no table, no clock of its own (the time comes in the context). Every
format ends in :meth:`ParseContext.accept`, so a timer from any format meets the
same limits (callback topic policy, payload size, how far ahead) and becomes the
same :class:`StoredTimer` — one internal representation, one set of guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from futures.ingress.limits import NO_PAYLOAD_LIMIT, ParseLimits
from futures.ingress.records import SourceRecord
from ktimers.deadletter import short
from ktimers.recurrence import RecurrenceError, series_of
from ktimers.wire import MAX_ID_BYTES, Future, StoredTimer

#: Latest due time accepted (epoch ms): 9999-12-31T23:59:59.999Z. Later times
#: are no dates for most readers (``datetime`` stops at year 9999), and any due
#: time in 0..MAX_DUE_MS fits the int64 of ``Future.due_ms`` and the table key.
MAX_DUE_MS = 253_402_300_799_999
_DUE_RANGE = f"0..{MAX_DUE_MS} ms (1970-01-01 to 9999-12-31T23:59:59.999Z)"

#: What a stored timer's table key adds to its size: ``futures.worker.table.table_key``
#: is ``b"t"``, the 8-byte due time, then the id (not imported: ingress never imports the worker).
TABLE_KEY_OVERHEAD = 9

#: Every reason a rejection from parsing can give (README, "timer-request-dlq"
#: and "Compatible formats"). The engine adds its own (``too-late``, ...).
PARSE_REASONS = frozenset(
    {
        "undecodable",  # not the format's encoding at all (or a tombstone where one means nothing)
        "unknown-kind",  # native: kt-kind neither future, cancel nor batch
        "unknown-message-index",  # framed: the index names no Future, FutureBatch or Cancel
        "schema-rejected",  # framed: the Schema Registry does not know the id, or its schema is incompatible
        "schema-registry-unavailable",  # framed: the Schema Registry did not answer
        "empty-batch",
        "missing-id",
        "invalid-id",  # not UTF-8, or longer than MAX_ID_BYTES
        "bad-due-time",  # absent, not a time, negative, or after MAX_DUE_MS
        "missing-header",  # etf1
        "invalid-header",  # etf1: a value or a name that is not UTF-8 text
        "missing-field",  # countdown
        "invalid-field",  # countdown: wrong type, or not Unicode text
        "missing-callback-topic",
        "invalid-callback-topic",
        "callback-topic-not-allowed",  # also: outside the list of the record's request topic
        "payload-too-large",  # the stored timer and its table key exceed TIMERS_MAX_PAYLOAD_BYTES
        "due-too-far",
        "unknown-topic",  # the record's topic carries no requests
        "internal-error",  # a parser raised: a bug of ours, the record is dead-lettered all the same
    }
)


def shown(data: bytes | str | None, limit: int = 64) -> str:
    """The repr of ``data`` for a detail, of its first ``limit`` items only: cheap on a key of megabytes."""
    if data is None or len(data) <= limit:
        return repr(data)
    return f"{data[:limit]!r}… ({len(data)} {'bytes' if isinstance(data, bytes) else 'characters'})"


@dataclass(frozen=True)
class Schedule:
    record: SourceRecord
    timer: StoredTimer

    @property
    def timer_id(self) -> str:
        return self.timer.future.id

    @property
    def due_ms(self) -> int:
        return self.timer.future.due_ms


@dataclass(frozen=True)
class CancelRequest:
    record: SourceRecord
    timer_id: str


@dataclass(frozen=True)
class Rejection:
    record: SourceRecord  # what goes to the dead-letter topic, as it was sent
    reason: str  # stable code, e.g. "undecodable"; documented in the README
    detail: str  # for humans
    timer_id: str = ""
    #: Headers the dead letter carries besides the reason (e.g. a batch's counts): the
    #: worker's own, never cut with the copied record.
    headers: tuple[tuple[str, bytes], ...] = ()


Request = Schedule | CancelRequest | Rejection


def seed_id(record: SourceRecord, index: int | None = None, *, namespaced: bool = False) -> str:
    """Id of a request that carries none: stable across re-reads of the record.

    ``seed-<partition>-<offset>`` on `timer-request` (the original seed format),
    ``-<index>`` appended for the n-th timer of a batch record, and the topic
    added (``seed-<topic>-<partition>-<offset>``) for other ingress topics, whose
    offsets would otherwise collide with `timer-request`'s.
    """
    base = f"seed-{record.topic}-" if namespaced else "seed-"
    base += f"{record.partition}-{record.offset}"
    return base if index is None else f"{base}-{index}"


@dataclass
class ParseContext:
    """What parsing needs besides the record: the limits and the time.

    ``now_ms`` (epoch ms) is the worker clock for the whole batch being parsed.
    One context serves a whole batch; it memoises per-topic checks.
    """

    limits: ParseLimits
    now_ms: int
    #: (request topic, callback topic) → why the callback topic is refused, or None.
    _topic_problems: dict[tuple[str, str], tuple[str, str] | None] = field(default_factory=dict, repr=False)

    @property
    def request_topic(self) -> str:
        return self.limits.topics.request

    def derived_id(self, record: SourceRecord, index: int | None = None) -> str:
        """:func:`seed_id`, namespaced by topic unless the record is on `timer-request`."""
        return seed_id(record, index, namespaced=record.topic != self.request_topic)

    def callback_topic_problem(self, topic: str, request_topic: str) -> tuple[str, str] | None:
        """Why a record of ``request_topic`` may not name callback topic ``topic``, or None."""
        key = (request_topic, topic)
        if key not in self._topic_problems:
            self._topic_problems[key] = self.limits.callback_topic_problem(topic, request_topic)
        return self._topic_problems[key]

    @property
    def payload_limited(self) -> bool:
        """Whether ``TIMERS_MAX_PAYLOAD_BYTES`` can refuse any record at all (the jobs parse without it)."""
        return self.limits.max_payload_bytes < NO_PAYLOAD_LIMIT

    def timer_problem(
        self, id_bytes: int, due_ms: int, callback_topic: str, request_topic: str
    ) -> tuple[str, str] | None:
        """Why a timer cannot be accepted, as (reason, detail), or None: every check but the payload size.

        ``id_bytes`` is the UTF-8 length of the timer id; ``due_ms`` epoch milliseconds;
        ``request_topic`` the topic the request came from (its callback-topic list applies).
        :meth:`accept` and the fast paths of the formats (:func:`futures.ingress.native.fast_parse`)
        both decide with it.
        """
        if id_bytes > MAX_ID_BYTES:
            return "invalid-id", f"timer id longer than {MAX_ID_BYTES} bytes"
        if not 0 <= due_ms <= MAX_DUE_MS:
            where = "negative" if due_ms < 0 else "after 9999-12-31T23:59:59.999Z"
            detail = f"due time {short(str(due_ms), 40)} ms is {where}; the allowed range is {_DUE_RANGE}"
            return "bad-due-time", detail
        problem = self.callback_topic_problem(callback_topic, request_topic)
        if problem is not None:
            # The detail names the topic, which may be a megabyte of input.
            return problem[0], short(problem[1])
        limits = self.limits
        if limits.max_due_ahead_s and due_ms > self.now_ms + limits.max_due_ahead_s * 1000:
            return (
                "due-too-far",
                f"due {due_ms} is more than {limits.max_due_ahead_s}s ahead (TIMERS_MAX_DUE_AHEAD_S)",
            )
        return None

    def accept(self, record: SourceRecord, future: Future, due_ms: int) -> Schedule | Rejection:
        """The checks every timer passes, whatever its format; ``future.id`` must be set.

        ``due_ms`` is epoch milliseconds, in 0..:data:`MAX_DUE_MS`. The stored
        timer with its table key must fit in ``TIMERS_MAX_PAYLOAD_BYTES``: it is
        one changelog record. On success ``future`` is normalised (``due_ms``
        set) and wrapped in the :class:`StoredTimer` the table holds.
        """
        timer_id = future.id
        id_bytes = len(timer_id.encode())
        problem = self.timer_problem(id_bytes, due_ms, future.callBackTopic, record.topic)
        if problem is not None:
            reason, detail = problem
            return Rejection(record, reason, detail, "" if reason == "invalid-id" else timer_id)
        if future.HasField("recurrence"):
            try:
                series_of(future.recurrence, due_ms)
            except RecurrenceError as exc:
                return Rejection(record, "invalid-recurrence", str(exc), timer_id)
        stored = StoredTimer(
            source_partition=record.partition,
            source_offset=record.offset,
            accepted_ms=self.now_ms,
            source_topic=record.topic,
        )
        # CopyFrom is about twice as fast as StoredTimer(future=...): per timer, it counts.
        stored.future.CopyFrom(future)
        stored.future.due_ms = due_ms
        # What the changelog must carry: the stored timer and its table key.
        size = stored.ByteSize() + TABLE_KEY_OVERHEAD + id_bytes
        limits = self.limits
        if size > limits.max_payload_bytes:
            return Rejection(
                record,
                "payload-too-large",
                f"stored timer is {size} bytes with its table key (callBack {len(future.callBack)} bytes); "
                f"the limit is {limits.max_payload_bytes} (TIMERS_MAX_PAYLOAD_BYTES)",
                timer_id,
            )
        future.due_ms = due_ms
        return Schedule(record, stored)
