"""What the engine sends besides its changelog: callbacks, `timer-events` and dead letters.

The fire path: :meth:`Dispatcher.send` produces the callbacks of due timers
(built by :mod:`futures.worker.callbacks`, ahead of time where it could) and
:meth:`Dispatcher.confirm` waits for their delivery reports; :meth:`Dispatcher.confirm_reports`
turns the reports into outcomes (delivered → FIRED event, refused for good → dead
letter, transient → retried on the next tick).

Events are gathered per `timer-request` partition and written as one
``TimerEventBatch`` record per partition and engine step
(:meth:`Dispatcher.produce_events`, which the engine calls before it flushes a
changelog write): a record per timer would cost a third of the fire path. Its
``SCHEDULED`` and ``FIRED`` events go column by column (``ScheduledTimers``,
``FiredTimers``): a ``TimerEvent`` message per accepted timer was a fifth of what
accepting it cost the engine.
Events and dead letters are collected in one :class:`~futures.worker.kafka.Deliveries`
that the engine checks before each changelog write is applied
(:meth:`Dispatcher.take_side`): a request counts as applied only when
everything it caused was delivered.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from futures.ingress.records import SourceRecord
from futures.ingress.requests import seed_id
from futures.worker.callback_queue import CallbackQueue
from futures.worker.callbacks import Callback, Item, stored_timer
from futures.worker.destinations import MAX_TOPICS, TopicDirectory
from futures.worker.fired_columns import fired_columns
from futures.worker.kafka import Deliveries, KafkaWriter, is_permanent, refuses_producer
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import Firing, WorkerStatus
from futures.worker.table import due_of_key, id_of_key
from ktimers.config import TopicsConfig
from ktimers.deadletter import dead_letter, short
from ktimers.logs import ThrottledLog
from ktimers.wire import (
    FIRED_COLUMNS,
    H_ERROR,
    H_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    KIND_BATCH,
    KIND_HEADER,
    SCHEDULED_COLUMNS,
    BatchPart,
    FiredTimers,
    ScheduledTimers,
    TimerEvent,
    TimerEventBatch,
    batch_parts,
    event_batch_key,
)

log = logging.getLogger(__name__)

Kind = TimerEvent.Kind

#: Largest `timer-events` batch record (bytes of its value), at most half the producer's
#: ``message.max.bytes``; a step with more events writes several records.
EVENT_BATCH_BYTES = 512 * 1024


#: Why a due timer is dead-lettered whose bytes in the table cannot be read (:meth:`Dispatcher.confirm`).
UNREADABLE = "unreadable-timer"


@dataclass
class Sending:
    """Callbacks produced by :meth:`Dispatcher.send`, their delivery reports not yet settled."""

    callbacks: list[Callback]
    deliveries: Deliveries
    fired_ms: int
    #: The piece's timers whose bytes could not be built into a callback (:meth:`Dispatcher.send`).
    refused: list[Item] = field(default_factory=list)


class _Scheduling:
    """SCHEDULED events of one partition being gathered: a ``ScheduledTimers`` block to be."""

    __slots__ = ("at_event", "at_ms", "due_ms", "ids", "source_offsets", "topics")

    def __init__(self, at_ms: int, at_event: int) -> None:
        self.at_ms = at_ms
        self.at_event = at_event  # the events of its batch before it
        self.ids: list[str] = []
        self.due_ms: list[int] = []
        self.source_offsets: list[int] = []
        self.topics: list[str] = []


@dataclass
class FireOutcome:
    done: list[int]  # delivered, or dead-lettered for good: delete these
    transient: list[int]  # keep, try again on the next tick
    dead_lettered: int = 0  # dead letters (of ``done`` and ``refused``) not yet known delivered
    #: Timers dead-lettered because their bytes could not be built into a callback: delete these too.
    refused: list[Item] = field(default_factory=list)


class Dispatcher:
    """Produces callbacks, events and dead letters through the worker's one producer."""

    def __init__(
        self,
        topics: TopicsConfig,
        writer: KafkaWriter,
        metrics: WorkerMetrics,
        status: WorkerStatus,
        clock: Callable[[], int],
        callback_topics: TopicDirectory,
        stored: Callable[[Callback], bytes | None],
    ) -> None:
        self._topics = topics
        #: A callback's timer as the table holds it, until it is settled (for its dead letter).
        self._stored = stored
        self._writer = writer
        self._metrics = metrics
        self._status = status
        self._clock = clock
        # Which callback topics exist, so a missing one never stalls a flush (futures/worker/destinations.py).
        self._callback_topics = callback_topics
        #: Queues callback records (compiled): :meth:`send` a piece of them, precise mode one at its
        #: millisecond (``put``, its failure under the index given, as a delivery report's).
        self.callbacks = CallbackQueue(writer.queue, writer.produce_callback, callback_topics.problem)
        self._topic_problem = callback_topics.problem
        #: A refusal of the callbacks producer itself, seen in a delivery report: replaced before
        #: the next send.
        self._refused: KafkaError | None = None
        # Callback topics of accepted timers, looked up ahead; the oldest beyond MAX_TOPICS are
        # forgotten (a forgotten topic is handed to the directory again with its next timer).
        self._expected: OrderedDict[str, None] = OrderedDict()
        self._side = Deliveries()  # events and dead letters since the last take_side()
        # Events not yet produced, by `timer-request` partition, in order (see produce_events).
        self._events: dict[int, TimerEventBatch] = {}
        # SCHEDULED events still being gathered, by partition: see scheduled.
        self._scheduling: dict[int, _Scheduling] = {}
        self._event_batch_bytes = min(EVENT_BATCH_BYTES, writer.max_record_bytes // 2)
        # Bad input and unavailable callback topics are counted in metrics; the log shows a few examples.
        self._rejections_log = ThrottledLog(log)
        self._retries_log = ThrottledLog(log)

    def produce_events(self) -> None:
        """Produce the events gathered so far: one ``TimerEventBatch`` record per partition
        (more where one would exceed :data:`EVENT_BATCH_BYTES`); their reports go with the dead letters'."""
        for partition in list(self._scheduling):
            self._close_scheduling(partition)
        batches, self._events = self._events, {}
        for partition, batch in batches.items():
            key = event_batch_key(partition)
            for part in _split(batch, self._event_batch_bytes):
                self._writer.produce(
                    self._topics.events, key, part, headers=_BATCH_HEADERS, deliveries=self._side
                )

    def _batch(self, partition: int) -> TimerEventBatch:
        batch = self._events.get(partition)
        if batch is None:
            batch = self._events[partition] = TimerEventBatch()
        return batch

    def take_side(self) -> Deliveries:
        """The delivery reports of the events and dead letters produced since the last call."""
        side, self._side = self._side, Deliveries()
        return side

    async def deliver_dead_letters(self, outcome: FireOutcome) -> None:
        """Before the tombstones of dead-lettered timers: their dead letters must be delivered,
        or a lost dead letter would lose the timer. Only when there are any (one flush)."""
        if outcome.dead_lettered:
            side = self.take_side()
            await self._writer.delivered(side)
            side.raise_first("event or dead-letter")

    # -- callbacks -----------------------------------------------------------------

    def send(
        self, callbacks: Iterable[Callback], fired_ms: int, refused: list[Item] | None = None
    ) -> Sending:
        """Produce ``callbacks`` (in firing order); :meth:`confirm` settles them once their
        delivery reports are in.

        ``callbacks`` may be lazy (built as they are taken): the first is on its way
        before the last is built. ``refused``: where building them puts the timers whose
        bytes cannot be built (filled as ``callbacks`` are taken), dead-lettered at :meth:`confirm`.
        """
        self.renew_if_refused()
        sending = Sending([], Deliveries(), fired_ms, [] if refused is None else refused)
        self.callbacks.put_all(callbacks, str(fired_ms).encode(), sending.deliveries, sending.callbacks)
        return sending

    async def confirm(self, sending: Sending) -> FireOutcome:
        """Wait for the delivery reports of what :meth:`send` produced, then settle them; the
        timers that could not be built are dead-lettered (:meth:`dead_letter_unreadable`)."""
        await self._writer.delivered(sending.deliveries)
        callbacks = sending.callbacks
        outcome = self.confirm_reports(callbacks, sending.deliveries, [sending.fired_ms] * len(callbacks))
        for item in sending.refused:
            self.dead_letter_unreadable(*item)
        outcome.refused = sending.refused
        outcome.dead_lettered += len(sending.refused)
        return outcome

    def confirm_reports(
        self, callbacks: list[Callback], deliveries: Deliveries, fired: list[int]
    ) -> FireOutcome:
        """Count, record and dead-letter by delivery report; say which timers to delete."""
        errors = traced_errors(callbacks, deliveries) if deliveries.failed else deliveries.errors
        if not errors:  # the common case: every callback delivered
            self._fired(callbacks, fired)
            return FireOutcome(list(range(len(callbacks))), [])
        done: list[int] = []
        transient: list[int] = []
        delivered: list[int] = []
        dead_lettered = 0
        for i, callback in enumerate(callbacks):
            err = errors.get(i)
            if err is None:
                done.append(i)
                delivered.append(i)
            elif is_permanent(err):
                done.append(i)
                dead_lettered += 1
                self.dead_letter_callback(callback, err)
            else:
                if refuses_producer(err):
                    self._refused = err
                transient.append(i)
                self._retries_log.warning(
                    "callback of timer %s to %s failed, will retry: %s",
                    callback.timer_id,
                    callback.topic,
                    err.str(),
                )
        self._fired([callbacks[i] for i in delivered], [fired[i] for i in delivered])
        return FireOutcome(done, transient, dead_lettered)

    def renew_if_refused(self) -> None:
        """Send through a new callbacks producer when the brokers refused the current one."""
        refused, self._refused = self._refused, None
        if refused is None or not self._writer.renew_callbacks():
            return
        log.warning("replaced the callbacks producer: the brokers refused it (%s)", refused.str())
        self.callbacks = CallbackQueue(self._writer.queue, self._writer.produce_callback, self._topic_problem)

    def _fired(self, callbacks: list[Callback], fired: list[int]) -> None:
        """FIRED events, metrics and status of delivered callbacks (``fired``: each one's dispatch time)."""
        # The events, column by column per partition (a FiredTimers block), in compiled code.
        columns, lateness_ms = fired_columns(callbacks, fired)
        now = self._clock()
        for partition, (ids, due_times, offsets) in columns.items():
            self._batch(partition).fired.add(
                id=ids, due_ms=due_times, source_offset=offsets, at_ms=now, partition=partition
            )
        # Metrics and status once per piece, not per timer.
        self._metrics.fired.inc(len(callbacks))
        self._metrics.lateness.observe_many([late / 1000 for late in lateness_ms])
        newest = max(len(callbacks) - self._status.keeps, 0)  # only these are shown: no tuple for the rest
        recent = zip(callbacks[newest:], fired[newest:], strict=True)
        shown = [Firing(c.timer_id, c.partition, c.due_ms, f) for c, f in recent]
        self._status.fired_many(shown, lateness_ms, fired)

    # -- events and dead letters -----------------------------------------------

    def event(
        self,
        timer_id: str,
        kind: TimerEvent.Kind,
        partition: int,
        *,
        due_ms: int = 0,
        source_offset: int = -1,
        reason: str = "",
        callback_topic: str = "",
    ) -> None:
        if partition in self._scheduling:
            self._close_scheduling(partition)  # its SCHEDULED events happened before this one
        self._batch(partition).events.add(
            id=timer_id,
            kind=kind,
            due_ms=due_ms,
            at_ms=self._clock(),
            partition=partition,
            source_offset=source_offset,
            reason=short(reason),
            callback_topic=callback_topic,
        )

    def scheduled(
        self,
        partition: int,
        now: int,
        timer_ids: Sequence[str],
        due_ms: Sequence[int],
        source_offsets: Sequence[int],
        callback_topics: Sequence[str],
    ) -> None:
        """The SCHEDULED events of timers of ``partition`` accepted at ``now`` (epoch ms, the
        batch's time by this worker's clock), column by column, in the order they were accepted.

        Gathered in columns (a ``ScheduledTimers`` block), which runs of timers accepted at one
        time share until another event of the partition comes: a run of timers costs a few
        list extends, not a call per timer. A callback topic seen for the first time is looked
        up now, not when its first timer fires (which would then wait for the next tick).
        """
        expected = self._expected
        for topic in dict.fromkeys(callback_topics):
            if topic not in expected:
                if len(expected) >= MAX_TOPICS:
                    expected.popitem(last=False)
                expected[topic] = None
                self._callback_topics.problem(topic)
        run = self._scheduling.get(partition)
        if run is None or run.at_ms != now:
            run = self._open_scheduling(partition, now)
        run.ids += timer_ids
        run.due_ms += due_ms
        run.source_offsets += source_offsets
        run.topics += callback_topics

    def _open_scheduling(self, partition: int, now: int) -> _Scheduling:
        self._close_scheduling(partition)
        run = self._scheduling[partition] = _Scheduling(now, len(self._batch(partition).events))
        return run

    def _close_scheduling(self, partition: int) -> None:
        """Write the partition's run of SCHEDULED events into its batch, at its place among the events."""
        run = self._scheduling.pop(partition, None)
        if run is not None:
            self._batch(partition).scheduled.add(
                id=run.ids,
                due_ms=run.due_ms,
                source_offset=run.source_offsets,
                callback_topic=run.topics,
                at_ms=run.at_ms,
                partition=partition,
                at_event=run.at_event,
            )

    def reject(
        self,
        record: SourceRecord,
        reason: str,
        detail: str,
        timer_id: str,
        extra: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        """Dead-letter a request record as it was (cut down to fit, if it must), with why and where from."""
        detail = short(detail)
        self._metrics.rejected.labels(reason).inc()
        self._status.dead_letter(reason)
        self._rejections_log.warning("rejected %s: %s (%s)", record.where(), reason, detail)
        ours = [
            (H_REASON, reason.encode()),
            (H_ERROR, detail.encode()),
            (H_SOURCE_TOPIC, record.topic.encode()),
            (H_SOURCE_PARTITION, str(record.partition).encode()),
            (H_SOURCE_OFFSET, str(record.offset).encode()),
            *extra,
        ]
        key, value, headers = dead_letter(
            record.key, record.value, record.headers, ours, self._writer.max_record_bytes
        )
        self._writer.produce(self._topics.dlq, key, value, headers=headers, deliveries=self._side)
        self.event(
            timer_id or seed_id(record),
            Kind.REJECTED,
            record.partition,
            source_offset=record.offset,
            reason=f"{reason}: {detail}",
        )

    def dead_letter_callback(self, callback: Callback, err: KafkaError) -> None:
        """A callback its topic refused for good: dead-letter the timer so it can be fixed and resent."""
        timer = stored_timer(callback, self._stored(callback))
        future = timer.future
        reason = "callback-undeliverable"
        detail = short(f"{future.callBackTopic}: {err.str()}")
        self._metrics.rejected.labels(reason).inc()
        self._status.dead_letter(reason)
        self._rejections_log.error("timer %s: callback undeliverable (%s), dead-lettered", future.id, detail)
        ours = [
            (H_REASON, reason.encode()),
            (H_ERROR, detail.encode()),
            (H_SOURCE_TOPIC, (timer.source_topic or self._topics.request).encode()),
            (H_SOURCE_PARTITION, str(timer.source_partition).encode()),
            (H_SOURCE_OFFSET, str(timer.source_offset).encode()),
        ]
        key, value, headers = dead_letter(
            future.id.encode(), future.SerializeToString(), (), ours, self._writer.max_record_bytes
        )
        self._writer.produce(self._topics.dlq, key, value, headers=headers, deliveries=self._side)
        self.event(
            future.id,
            Kind.REJECTED,
            callback.partition,
            due_ms=future.due_ms,
            source_offset=timer.source_offset,
            reason=f"{reason}: {detail}",
        )

    def dead_letter_unreadable(self, key: bytes, partition: int, stored: bytes) -> None:
        """A due timer whose bytes in the table protobuf does not read (a table damaged, or
        written by something other than a worker): no callback can ever be built from them.
        Dead-lettered as the table holds it, so that no firing of its partition stops on it."""
        timer_id, due_ms = id_of_key(key), due_of_key(key)
        detail = f"the stored timer ({len(stored)} bytes) is not a StoredTimer protobuf reads"
        self._metrics.rejected.labels(UNREADABLE).inc()
        self._status.dead_letter(UNREADABLE)
        self._rejections_log.error("timer %s of partition %d: %s, dead-lettered", timer_id, partition, detail)
        ours = [
            (H_REASON, UNREADABLE.encode()),
            (H_ERROR, detail.encode()),
            (H_SOURCE_TOPIC, self._topics.request.encode()),
            (H_SOURCE_PARTITION, str(partition).encode()),
            (H_SOURCE_OFFSET, b"-1"),
        ]
        key_bytes, value, headers = dead_letter(
            timer_id.encode(), stored, (), ours, self._writer.max_record_bytes
        )
        self._writer.produce(self._topics.dlq, key_bytes, value, headers=headers, deliveries=self._side)
        self.event(timer_id, Kind.REJECTED, partition, due_ms=due_ms, reason=f"{UNREADABLE}: {detail}")


_BATCH_HEADERS = [(KIND_HEADER, KIND_BATCH)]


def _split(batch: TimerEventBatch, max_bytes: int) -> list[bytes]:
    """``batch`` serialized in values of at most ``max_bytes``, in order: halved until each fits.

    An event is a few KiB at most (ids ≤ 512 bytes, reasons cut short); ``max_bytes`` is larger.
    """
    halves = None if batch.ByteSize() <= max_bytes else _halves(batch)
    if halves is None:
        return [batch.SerializeToString()]
    return [part for half in halves for part in _split(half, max_bytes)]


def _halves(batch: TimerEventBatch) -> tuple[TimerEventBatch, TimerEventBatch] | None:
    """``batch`` cut in two whose events, read one after the other, are ``batch``'s; None for one event."""
    parts = batch_parts(batch)
    if len(parts) > 1:
        half = len(parts) // 2
        return _batch_of(parts[:half]), _batch_of(parts[half:])
    block = parts[0] if parts else None
    if isinstance(block, TimerEvent) or block is None or len(block.id) < 2:
        return None
    # One block of columns: each half takes half of every column.
    names = FIRED_COLUMNS if isinstance(block, FiredTimers) else SCHEDULED_COLUMNS
    whole = block.SerializeToString()
    first, second = type(block).FromString(whole), type(block).FromString(whole)
    half = len(block.id) // 2
    for column in names:
        del getattr(first, column)[half:]
        del getattr(second, column)[:half]
    return _batch_of([first]), _batch_of([second])


def _batch_of(parts: Sequence[BatchPart]) -> TimerEventBatch:
    """The batch whose parts, in order, are ``parts`` (see ``ktimers.wire.batch_parts``)."""
    batch = TimerEventBatch()
    for part in parts:
        if isinstance(part, TimerEvent):
            batch.events.append(part)
        elif isinstance(part, ScheduledTimers):
            block = batch.scheduled.add()
            block.CopyFrom(part)
            block.at_event = len(batch.events)
        else:
            batch.fired.append(part)
    return batch


def traced_errors(callbacks: Sequence[Callback], deliveries: Deliveries) -> dict[int, KafkaError]:
    """The errors of ``callbacks`` that failed, by index in the piece.

    A delivery report names its record, not its timer: confluent-kafka leaves the headers
    (``kt-id``) out. A failure is traced by topic, key and value to every callback of the
    piece that has all three; callbacks alike in all three share it (one delivered among
    them is kept or dead-lettered with the failed one: at least once). A failure that names
    no callback of the piece fails them all.
    """
    errors = dict(deliveries.errors)
    alike: dict[tuple[str, bytes, bytes], list[int]] = {}
    for i, callback in enumerate(callbacks):
        alike.setdefault((callback.topic, callback.record_key or b"", callback.value or b""), []).append(i)
    for err, msg in deliveries.failed:
        traced = None if msg is None else alike.get((msg.topic() or "", msg.key() or b"", msg.value() or b""))
        for i in range(len(callbacks)) if traced is None else traced:
            errors.setdefault(i, err)
    return errors
