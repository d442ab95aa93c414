"""What the engine sends besides its changelog: callbacks, `timer-events` and dead letters.

The fire path: :meth:`Dispatcher.fire` produces the callbacks of due timers
and waits for their delivery reports; :meth:`Dispatcher.settle` turns the
reports into outcomes (delivered → FIRED event, refused for good → dead
letter, transient → retried on the next tick). Events and dead letters are
collected in one :class:`~futures.worker.kafka.Deliveries` that the engine
checks before each changelog write is applied (:meth:`Dispatcher.take_side`):
a request counts as applied only when everything it caused was delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError

from futures.ingress.records import SourceRecord
from futures.ingress.requests import seed_id
from futures.worker.destinations import TopicDirectory
from futures.worker.kafka import Deliveries, KafkaWriter, is_permanent
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import Firing, WorkerStatus
from ktimers.config import TopicsConfig
from ktimers.deadletter import dead_letter, short
from ktimers.logs import ThrottledLog
from ktimers.wire import (
    H_ERROR,
    H_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    StoredTimer,
    TimerEvent,
    callback_headers,
)

log = logging.getLogger(__name__)

Kind = TimerEvent.Kind
# Kind.X goes through the enum wrapper's __getattr__ (~0.7 µs): too slow per timer.
_SCHEDULED = TimerEvent.SCHEDULED
_FIRED = TimerEvent.FIRED


@dataclass
class FireOutcome:
    done: list[int]  # delivered, or dead-lettered for good: delete these
    transient: list[int]  # keep, try again on the next tick
    dead_lettered: int = 0  # of ``done``: dead-lettered, their dead letters not yet known delivered


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
    ) -> None:
        self._topics = topics
        self._writer = writer
        self._metrics = metrics
        self._status = status
        self._clock = clock
        # Which callback topics exist, so a missing one never stalls a flush (futures/worker/destinations.py).
        self._callback_topics = callback_topics
        self._side = Deliveries()  # events and dead letters since the last take_side()
        # Bad input and unavailable callback topics are counted in metrics; the log shows a few examples.
        self._rejections_log = ThrottledLog(log)
        self._retries_log = ThrottledLog(log)

    def take_side(self) -> Deliveries:
        """The delivery reports of the events and dead letters produced since the last call."""
        side, self._side = self._side, Deliveries()
        return side

    async def deliver_dead_letters(self, outcome: FireOutcome) -> None:
        """Before the tombstones of dead-lettered timers: their dead letters must be delivered,
        or a lost dead letter would lose the timer. Only when there are any (one flush)."""
        if outcome.dead_lettered:
            await self._writer.flush()
            self.take_side().raise_first("event or dead-letter")

    # -- callbacks -----------------------------------------------------------------

    def produce_callback(self, timer: StoredTimer, fired_ms: int, deliveries: Deliveries, index: int) -> None:
        future = timer.future
        problem = self._callback_topics.problem(future.callBackTopic)
        if problem is not None:
            deliveries.errors[index] = problem  # settled like a delivery report
            return
        self._writer.produce(
            future.callBackTopic,
            future.callBackKey.encode(),
            future.callBack,
            headers=callback_headers(timer, fired_ms),
            deliveries=deliveries,
            index=index,
        )

    async def fire(self, timers: Sequence[tuple[int, StoredTimer]], fired_ms: int) -> FireOutcome:
        """Produce callbacks and wait for every delivery report."""
        deliveries = Deliveries()
        for i, (_, timer) in enumerate(timers):
            self.produce_callback(timer, fired_ms, deliveries, i)
        await self._writer.flush()
        return self.settle(timers, deliveries, [fired_ms] * len(timers))

    def settle(
        self, timers: Sequence[tuple[int, StoredTimer]], deliveries: Deliveries, fired: Sequence[int]
    ) -> FireOutcome:
        """Count, record and dead-letter by delivery report; say which timers to delete."""
        done: list[int] = []
        transient: list[int] = []
        dead_lettered = 0
        firings: list[Firing] = []
        errors = deliveries.errors
        now = self._clock()
        produce = self._writer.produce
        events = self._topics.events
        side = self._side
        for i, (partition, timer) in enumerate(timers):
            err = errors.get(i) if errors else None
            future = timer.future
            if err is None:
                done.append(i)
                timer_id, due_ms = future.id, future.due_ms
                firings.append(Firing(timer_id, partition, due_ms, fired[i]))
                # What event() does, inlined: this runs once per fired timer.
                event = TimerEvent(
                    id=timer_id,
                    kind=_FIRED,
                    due_ms=due_ms,
                    at_ms=now,
                    partition=partition,
                    source_offset=timer.source_offset,
                )
                produce(events, timer_id.encode(), event.SerializeToString(), deliveries=side)
            elif is_permanent(err):
                done.append(i)
                dead_lettered += 1
                self.dead_letter_callback(partition, timer, err)
            else:
                transient.append(i)
                self._retries_log.warning(
                    "callback of timer %s to %s failed, will retry: %s",
                    future.id,
                    future.callBackTopic,
                    err.str(),
                )
        # Metrics and status once per chunk, not per timer.
        self._metrics.fired.inc(len(firings))
        self._metrics.lateness.observe_many([max(f.fired_ms - f.due_ms, 0) / 1000 for f in firings])
        self._status.fired_many(firings)
        return FireOutcome(done, transient, dead_lettered)

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
        event = TimerEvent(
            id=timer_id,
            kind=kind,
            due_ms=due_ms,
            at_ms=self._clock(),
            partition=partition,
            source_offset=source_offset,
            reason=short(reason),
            callback_topic=callback_topic,
        )
        self._writer.produce(
            self._topics.events, timer_id.encode(), event.SerializeToString(), deliveries=self._side
        )

    def scheduled(
        self, timer_id: str, due_ms: int, partition: int, source_offset: int, callback_topic: str, now: int
    ) -> None:
        """The SCHEDULED event of a timer accepted at ``now`` (epoch ms, the batch's clock).

        What :meth:`event` does, inlined: this runs once per scheduled timer.
        """
        event = TimerEvent(
            id=timer_id,
            kind=_SCHEDULED,
            due_ms=due_ms,
            at_ms=now,
            partition=partition,
            source_offset=source_offset,
            callback_topic=callback_topic,
        )
        self._writer.produce(
            self._topics.events, timer_id.encode(), event.SerializeToString(), deliveries=self._side
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

    def dead_letter_callback(self, partition: int, timer: StoredTimer, err: KafkaError) -> None:
        """A callback its topic refused for good: dead-letter the timer so it can be fixed and resent."""
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
            partition,
            due_ms=future.due_ms,
            source_offset=timer.source_offset,
            reason=f"{reason}: {detail}",
        )
