"""What every ingress format turns a record into, and the checks every timer passes.

A format module is a pure function ``parse(record, context) -> list[Request]``:
no Kafka, no table, no clock of its own (the time comes in the context). Every
format ends in :meth:`ParseContext.accept`, so a timer from any format meets the
same limits (callback topic policy, payload size, how far ahead) and becomes the
same :class:`StoredTimer` — one internal representation, one set of guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from futures.config import WorkerConfig
from futures.records import SourceRecord
from ktimers.wire import Future, StoredTimer

#: Longest timer id accepted (bytes): ids are part of every table key.
MAX_ID_BYTES = 512


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
    """What parsing needs besides the record: the worker's limits and the time.

    ``now_ms`` (epoch ms) is the worker clock for the whole batch being parsed.
    One context serves a whole batch; it memoises per-topic checks.
    """

    config: WorkerConfig
    now_ms: int
    _topic_problems: dict[str, tuple[str, str] | None] = field(default_factory=dict, repr=False)

    @property
    def request_topic(self) -> str:
        return self.config.common.topics.request

    def derived_id(self, record: SourceRecord, index: int | None = None) -> str:
        """:func:`seed_id`, namespaced by topic unless the record is on `timer-request`."""
        return seed_id(record, index, namespaced=record.topic != self.request_topic)

    def callback_topic_problem(self, topic: str) -> tuple[str, str] | None:
        if topic not in self._topic_problems:
            self._topic_problems[topic] = self.config.callback_topic_problem(topic)
        return self._topic_problems[topic]

    def accept(self, record: SourceRecord, future: Future, due_ms: int) -> Schedule | Rejection:
        """The checks every timer passes, whatever its format; ``future.id`` must be set.

        On success ``future`` is normalised (``due_ms`` set) and wrapped in the
        :class:`StoredTimer` the table holds.
        """
        timer_id = future.id
        if len(timer_id.encode()) > MAX_ID_BYTES:
            return Rejection(record, "invalid-id", f"timer id longer than {MAX_ID_BYTES} bytes")
        if due_ms < 0:
            return Rejection(record, "bad-due-time", f"due time {due_ms} ms is negative", timer_id)
        problem = self.callback_topic_problem(future.callBackTopic)
        if problem is not None:
            return Rejection(record, problem[0], problem[1], timer_id)
        config = self.config
        if len(future.callBack) > config.max_payload_bytes:
            return Rejection(
                record,
                "payload-too-large",
                f"callBack is {len(future.callBack)} bytes; the limit is {config.max_payload_bytes} "
                "(TIMERS_MAX_PAYLOAD_BYTES)",
                timer_id,
            )
        if config.max_due_ahead_s and due_ms > self.now_ms + config.max_due_ahead_s * 1000:
            return Rejection(
                record,
                "due-too-far",
                f"due {due_ms} is more than {config.max_due_ahead_s}s ahead (TIMERS_MAX_DUE_AHEAD_S)",
                timer_id,
            )
        future.due_ms = due_ms
        stored = StoredTimer(
            source_partition=record.partition,
            source_offset=record.offset,
            accepted_ms=self.now_ms,
            source_topic=record.topic,
        )
        # CopyFrom is about twice as fast as StoredTimer(future=...): per timer, it counts.
        stored.future.CopyFrom(future)
        return Schedule(record, stored)
