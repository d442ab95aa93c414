"""The join of requests and ticks: request → table → tick → dispatch.

* :meth:`TimerEngine.ingest` takes a batch of `timer-request` records and
  writes them to the partition tables (schedule, replace, cancel), or fires
  them at once when their due time has already passed the partition's watermark.
* :meth:`TimerEngine.advance` takes a batch of ticks; for each partition whose
  clock moved to second s it fires every timer due by s (one range scan), then
  deletes them and moves the watermark to s.

Durability order, which is what makes a crash lose nothing:
callbacks are flushed before their timers' tombstones are written; changelog
records are flushed before the local table changes; and the consumed offsets
are committed by Faust only after these coroutines return.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from futures.config import LatePolicy, WorkerConfig
from futures.kafka import Deliveries, KafkaWriter, is_permanent
from futures.metrics import WorkerMetrics
from futures.records import SourceRecord
from futures.requests import CancelRequest, Rejection, Schedule, parse_request, seed_id
from futures.table import PartitionTimers, Record, progress_record, table_key
from ktimers.wire import (
    H_DUE_MS,
    H_ERROR,
    H_FIRED_MS,
    H_ID,
    H_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    H_TOKEN,
    StoredTimer,
    Tick,
    TimerEvent,
    parse_second_key,
)

log = logging.getLogger(__name__)

Kind = TimerEvent.Kind


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def callback_headers(timer: StoredTimer, fired_ms: int) -> list[tuple[str, bytes]]:
    """The user's headers, then ours (last wins for readers, so ours cannot be forged)."""
    future = timer.future
    headers = [(h.key, h.value) for h in future.headers]
    headers.append((H_ID, future.id.encode()))
    headers.append((H_DUE_MS, str(future.due_ms).encode()))
    if future.token:
        headers.append((H_TOKEN, future.token.encode()))
    headers.append((H_FIRED_MS, str(fired_ms).encode()))
    return headers


def tick_second(record: SourceRecord) -> int | None:
    """The second a tick announces: the Tick value, else the decimal key."""
    if record.value:
        try:
            tick = Tick.FromString(record.value)
        except Exception:  # noqa: BLE001 - any undecodable value falls back to the key
            tick = None
        if tick is not None and tick.second > 0:
            return int(tick.second)
    return parse_second_key(record.key)


@dataclass
class _Changes:
    """Changelog records and progress of one partition, not yet written."""

    records: list[Record] = field(default_factory=list)
    pending_delta: int = 0
    watermark: int | None = None  # new watermark (epoch s), when the clock moved
    request_offset: int | None = None  # last `timer-request` offset applied, when requests were
    # Ids touched in this batch → due ms (None = removed): later requests in the
    # same batch must see earlier ones before anything reaches the table.
    overlay: dict[str, int | None] = field(default_factory=dict)


@dataclass
class _FireOutcome:
    done: list[int]  # delivered, or dead-lettered for good: delete these
    transient: list[int]  # keep, try again on the next tick


class TimerEngine:
    def __init__(
        self,
        config: WorkerConfig,
        tables: Callable[[int], PartitionTimers],
        writer: KafkaWriter,
        metrics: WorkerMetrics,
        clock: Callable[[], int] = wall_clock_ms,
        *,
        owns: Callable[[int], bool] = lambda partition: True,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self.config = config
        self._tables = tables
        self._writer = writer
        self.metrics = metrics
        self._clock = clock
        self._topics = config.common.topics
        self._owns = owns
        # Ingest and firing both mutate the tables; one at a time keeps the
        # overlay, the watermark checks and the changelog order consistent.
        # The store shares it, to close revoked partitions between mutations.
        self._lock = lock or asyncio.Lock()
        self._side = Deliveries()  # events and dead letters since the last commit

    # -- request → table -------------------------------------------------------

    async def ingest(self, records: Sequence[SourceRecord]) -> None:
        """Apply a batch of `timer-request` records; durable when this returns."""
        async with self._lock:
            records = self._owned(records)
            now = self._clock()
            changes: dict[int, _Changes] = defaultdict(_Changes)
            fire_now: list[tuple[int, StoredTimer]] = []
            for record in records:
                if record.offset <= self._tables(record.partition).request_offset:
                    # Applied before a restart or rebalance, read again from an
                    # older committed offset: applying it twice could fire twice.
                    self.metrics.requests_skipped.inc()
                    continue
                part = changes[record.partition]
                part.request_offset = record.offset
                request = parse_request(record, self.config, now)
                if isinstance(request, Rejection):
                    self._reject(request.record, request.reason, request.detail, request.timer_id)
                elif isinstance(request, CancelRequest):
                    self._cancel(request, part)
                else:
                    late = self._schedule(request, part, now)
                    if late is not None:
                        fire_now.append((record.partition, late))
            if fire_now:
                outcome = await self._fire(fire_now, self._clock())
                for i in outcome.transient:
                    partition, timer = fire_now[i]
                    self._keep_for_retry(partition, timer, changes[partition])
            await self._commit(changes)

    def _owned(self, records: Sequence[SourceRecord]) -> Sequence[SourceRecord]:
        """Drop records of partitions revoked while they were buffered: the new owner reads them."""
        kept = [r for r in records if self._owns(r.partition)]
        if len(kept) < len(records):
            log.info("skipped %d records of partitions no longer assigned here", len(records) - len(kept))
        return kept

    def _keep_for_retry(self, partition: int, timer: StoredTimer, part: _Changes) -> None:
        """Store a late timer whose callback failed transiently, so the next tick retries it.

        Its key is placed just after the watermark (scans start there); the
        Future keeps its real due time for headers and lateness.
        """
        self.metrics.dispatch_retries.inc()
        retry_ms = self._tables(partition).watermark * 1000 + 1
        part.records.append((table_key(retry_ms, timer.future.id), timer.SerializeToString()))
        part.overlay[timer.future.id] = retry_ms
        part.pending_delta += 1

    def _current_due(self, part: _Changes, table: PartitionTimers, timer_id: str) -> int | None:
        if timer_id in part.overlay:
            return part.overlay[timer_id]
        return table.due_of(timer_id)

    def _cancel(self, request: CancelRequest, part: _Changes) -> None:
        partition = request.record.partition
        table = self._tables(partition)
        due = self._current_due(part, table, request.timer_id)
        if due is None:
            self.metrics.cancel_missed.inc()
            self._event(
                request.timer_id,
                Kind.CANCEL_MISSED,
                partition,
                reason="not pending: unknown or already fired",
            )
            return
        part.records.append((table_key(due, request.timer_id), None))
        part.overlay[request.timer_id] = None
        part.pending_delta -= 1
        self.metrics.cancelled.inc()
        self._event(request.timer_id, Kind.CANCELLED, partition, due_ms=due)

    def _schedule(self, request: Schedule, part: _Changes, now: int) -> StoredTimer | None:
        """Stage a schedule; return the timer when it is already due and must fire now."""
        partition = request.record.partition
        table = self._tables(partition)
        timer_id, due_ms = request.timer_id, request.due_ms
        old_due = self._current_due(part, table, timer_id)
        new_key = table_key(due_ms, timer_id)
        if old_due is not None and table_key(old_due, timer_id) != new_key:
            # Latest wins: the older version is removed, not fired.
            part.records.append((table_key(old_due, timer_id), None))
            part.overlay[timer_id] = None
            part.pending_delta -= 1
            old_due = None
        if table.watermark >= 0 and due_ms <= table.watermark * 1000:
            lateness_s = (now - due_ms) / 1000
            if lateness_s > self.config.max_lateness_s and self.config.late_policy is not LatePolicy.FIRE:
                detail = (
                    f"due {lateness_s:.1f}s ago, more than TIMERS_MAX_LATENESS_S={self.config.max_lateness_s}"
                )
                if self.config.late_policy is LatePolicy.DLQ:
                    self._reject(request.record, "too-late", detail, timer_id)
                else:
                    self.metrics.rejected.labels("too-late").inc()
                    self._event(
                        timer_id,
                        Kind.REJECTED,
                        partition,
                        due_ms=due_ms,
                        reason=f"too-late (dropped): {detail}",
                    )
                return None
            return request.timer
        part.records.append((new_key, request.timer.SerializeToString()))
        part.overlay[timer_id] = due_ms
        if old_due is None:
            part.pending_delta += 1
        self.metrics.scheduled.inc()
        self._event(
            timer_id,
            Kind.SCHEDULED,
            partition,
            due_ms=due_ms,
            source_offset=request.record.offset,
            callback_topic=request.timer.future.callBackTopic,
        )
        return None

    # -- tick → dispatch -------------------------------------------------------

    async def advance(self, ticks: Sequence[SourceRecord]) -> None:
        """Apply a batch of ticks: fire what is due in each partition whose clock moved."""
        latest: dict[int, int] = {}
        received: dict[int, int] = defaultdict(int)
        for record in self._owned(ticks):
            second = tick_second(record)
            if second is None:
                self.metrics.ticks.labels("invalid").inc()
                log.warning("ignoring tick %s with key %r: not an epoch second", record.where(), record.key)
                continue
            received[record.partition] += 1
            if second > latest.get(record.partition, -1):
                latest[record.partition] = second
        if not latest:
            return
        async with self._lock:
            changes: dict[int, _Changes] = {}
            for partition, second in sorted(latest.items()):
                target = self._trusted_second(partition, second)
                if target is None:
                    continue
                part = _Changes()
                if await self._fire_due(partition, target, part):
                    part.watermark = target
                changes[partition] = part
            await self._commit(changes)
        # Every tick that did not move a clock — older, repeated, or one of
        # several oscillators' copies of the same second — is a duplicate.
        advanced = sum(1 for part in changes.values() if part.watermark is not None)
        self.metrics.ticks.labels("advanced").inc(advanced)
        self.metrics.ticks.labels("duplicate").inc(sum(received.values()) - advanced)

    def _trusted_second(self, partition: int, second: int) -> int | None:
        """The second partition's clock may move to, or None for a no-op tick."""
        table = self._tables(partition)
        if second <= table.watermark:
            return None
        # Never trust a tick ahead of our own clock by more than the tolerance:
        # a misconfigured oscillator must not fire timers early.
        cap = (self._clock() + self.config.clock_tolerance_ms) // 1000
        if second > cap:
            self.metrics.ticks.labels("ahead").inc()
            log.warning(
                "tick for second %d on partition %d is ahead of this worker's clock (%d + %d ms tolerance); "
                "firing only up to %d. Check the oscillator host's clock.",
                second, partition, self._clock(), self.config.clock_tolerance_ms, cap,
            )  # fmt: skip
            second = cap
            if second <= table.watermark:
                return None
        return second

    async def _fire_due(self, partition: int, second: int, part: _Changes) -> bool:
        """Fire the timers of ``partition`` due by ``second``; False if some must wait for a retry."""
        table = self._tables(partition)
        limit_ms = second * 1000
        chunk = self.config.fire_chunk_size
        # Timers kept for a retry stay at the head of the range; scan on past
        # them so that one unavailable topic does not hold back the rest.
        after: bytes | None = None
        complete = True
        while True:
            due = table.due_by(limit_ms, chunk, after=after)
            if not due:
                return complete
            timers = [StoredTimer.FromString(d.value) for d in due]
            outcome = await self._fire([(partition, t) for t in timers], self._clock())
            for i in outcome.done:
                part.records.append((due[i].key, None))
            part.pending_delta -= len(outcome.done)
            if outcome.transient:
                self.metrics.dispatch_retries.inc(len(outcome.transient))
                complete = False
                after = due[-1].key
            if len(due) < chunk:
                return complete
            # A large second: make this chunk durable before scanning on, so the
            # table (and memory) never holds more than one chunk in flight.
            await self._commit({partition: part})
            part.records.clear()
            part.pending_delta = 0

    async def _fire(self, timers: Sequence[tuple[int, StoredTimer]], fired_ms: int) -> _FireOutcome:
        """Produce callbacks and wait for every delivery report."""
        deliveries = Deliveries()
        for i, (_, timer) in enumerate(timers):
            future = timer.future
            self._writer.produce(
                future.callBackTopic,
                future.callBackKey.encode(),
                future.callBack,
                headers=callback_headers(timer, fired_ms),
                deliveries=deliveries,
                index=i,
            )
        await self._writer.flush()
        done, transient = [], []
        for i, (partition, timer) in enumerate(timers):
            err = deliveries.errors.get(i)
            future = timer.future
            if err is None:
                done.append(i)
                self.metrics.fired.inc()
                self.metrics.lateness.observe(max(fired_ms - future.due_ms, 0) / 1000)
                self._event(
                    future.id, Kind.FIRED, partition, due_ms=future.due_ms, source_offset=timer.source_offset
                )
            elif is_permanent(err):
                done.append(i)
                self._dead_letter_callback(partition, timer, err)
            else:
                transient.append(i)
                log.warning(
                    "callback of timer %s to %s failed, will retry: %s",
                    future.id,
                    future.callBackTopic,
                    err.str(),
                )
        return _FireOutcome(done, transient)

    # -- table writes ----------------------------------------------------------

    async def _commit(self, changes: dict[int, _Changes]) -> None:
        """Write changelog records, wait for them, then apply them to the local tables.

        Every write ends with the partition's progress record (watermark and last
        applied request offset). With ``isolate_changelog_tail`` (embedded broker)
        it goes out in a batch of its own.
        """
        changes = {
            p: c
            for p, c in changes.items()
            if c.records or c.watermark is not None or c.request_offset is not None
        }
        changelog = self.config.changelog_topic
        deliveries = Deliveries()
        staged: dict[int, list[Record]] = {}
        for partition, part in changes.items():
            staged[partition] = list(part.records)
            for key, value in part.records:
                self._writer.produce(changelog, key, value, partition=partition, deliveries=deliveries)
        if self.config.common.kafka.settings.isolate_changelog_tail:
            await self._writer.flush()
        for partition, part in changes.items():
            table = self._tables(partition)
            tail = progress_record(
                table.watermark if part.watermark is None else part.watermark,
                table.request_offset if part.request_offset is None else part.request_offset,
            )
            staged[partition].append(tail)
            self._writer.produce(changelog, tail[0], tail[1], partition=partition, deliveries=deliveries)
        await self._writer.flush()
        deliveries.raise_first("changelog")
        side, self._side = self._side, Deliveries()
        side.raise_first("event or dead-letter")
        for partition, records in staged.items():
            table = self._tables(partition)
            table.apply(
                records, deliveries.offsets.get(partition), pending_delta=changes[partition].pending_delta
            )

    # -- events and dead letters -----------------------------------------------

    def _event(
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
            reason=reason,
            callback_topic=callback_topic,
        )
        self._writer.produce(
            self._topics.events, timer_id.encode(), event.SerializeToString(), deliveries=self._side
        )

    def _reject(self, record: SourceRecord, reason: str, detail: str, timer_id: str) -> None:
        """Dead-letter a request record as it was, with why and where it came from."""
        self.metrics.rejected.labels(reason).inc()
        log.warning("rejected %s: %s (%s)", record.where(), reason, detail)
        headers = [
            *record.headers,
            (H_REASON, reason.encode()),
            (H_ERROR, detail.encode()),
            (H_SOURCE_TOPIC, record.topic.encode()),
            (H_SOURCE_PARTITION, str(record.partition).encode()),
            (H_SOURCE_OFFSET, str(record.offset).encode()),
        ]
        self._writer.produce(
            self._topics.dlq, record.key, record.value, headers=headers, deliveries=self._side
        )
        self._event(
            timer_id or seed_id(record),
            Kind.REJECTED,
            record.partition,
            source_offset=record.offset,
            reason=f"{reason}: {detail}",
        )

    def _dead_letter_callback(self, partition: int, timer: StoredTimer, err: KafkaError) -> None:
        """A callback its topic refused for good: dead-letter the timer so it can be fixed and resent."""
        future = timer.future
        reason = "callback-undeliverable"
        detail = f"{future.callBackTopic}: {err.str()}"
        self.metrics.rejected.labels(reason).inc()
        log.error("timer %s: callback undeliverable (%s), dead-lettered", future.id, detail)
        headers = [
            (H_REASON, reason.encode()),
            (H_ERROR, detail.encode()),
            (H_SOURCE_TOPIC, self._topics.request.encode()),
            (H_SOURCE_PARTITION, str(timer.source_partition).encode()),
            (H_SOURCE_OFFSET, str(timer.source_offset).encode()),
        ]
        self._writer.produce(
            self._topics.dlq,
            future.id.encode(),
            future.SerializeToString(),
            headers=headers,
            deliveries=self._side,
        )
        self._event(
            future.id,
            Kind.REJECTED,
            partition,
            due_ms=future.due_ms,
            source_offset=timer.source_offset,
            reason=f"{reason}: {detail}",
        )
