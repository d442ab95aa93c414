"""Request → table: a step of `timer-request` records applied to the partition tables.

:meth:`Ingest.apply` parses each record by its topic's format
(:mod:`futures.ingress.requests`) and stages what it asks — schedule, replace, cancel, or
a dead letter with the reason — per partition (:class:`~futures.worker.changelog.Changes`),
so later requests of a step see earlier ones before anything reaches the table. Every
``TIMERS_FIRE_CHUNK_SIZE`` timers, and at the end of the step, the staged changes are
written (:func:`~futures.worker.changelog.commit`); the timers accepted already due
(at or below their partition's clock) are then fired from the table by the fire path,
as a tick fires them (:class:`~futures.worker.firing.Firing`).

Applying is idempotent: a record at or below its partition's last applied offset (kept
in the progress record) was applied before a restart or rebalance and is skipped; a
gap in the offsets (records Faust skipped during a rebalance) is read back and applied
in order (:mod:`futures.worker.gaps`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence

from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, RequestParser, Schedule
from futures.worker.changelog import Changes, commit
from futures.worker.config import LatePolicy
from futures.worker.context import EngineContext
from futures.worker.gaps import GapReader
from futures.worker.series import is_recurring, reject_invalid
from futures.worker.table import PartitionTimers, table_key
from futures.worker.windows import Windows
from ktimers.wire import TimerEvent

log = logging.getLogger(__name__)

Kind = TimerEvent.Kind
#: Precise mode: timers staged between two chances for the sending windows to run.
_YIELD_EVERY = 200

#: Fires each partition's timers due by a second (:meth:`Firing.fire`).
Fire = Callable[[dict[int, int]], Awaitable[object]]


class Ingest:
    def __init__(
        self, ctx: EngineContext, fire: Fire, windows: Windows | None, gaps: GapReader | None
    ) -> None:
        self._ctx = ctx
        self._fire = fire
        self._windows = windows  # precise mode's, or None
        self._gaps = gaps  # reads back request records the stream skipped

    async def apply(self, records: Sequence[SourceRecord]) -> None:
        """Apply a batch of request records of any ingress topic; durable when this returns.

        A record may hold many timers (a ``FutureBatch``): every
        ``fire_chunk_size`` timers the records parsed so far are made durable,
        so one call never holds more than that in memory.
        """
        async with self._ctx.lock:
            records = self.owned(records)
            now = self._ctx.clock()
            parser = RequestParser(self._ctx.config.parse_limits, now)
            changes: dict[int, Changes] = defaultdict(Changes)
            staged = yielded = 0
            request_topic = self._ctx.config.common.topics.request
            queue = deque((record, True) for record in records)
            while queue:
                record, check_gap = queue.popleft()
                table = self._ctx.tables(record.partition)
                is_request = record.topic == request_topic
                durable = table.request_offset if is_request else table.topic_offset(record.topic)
                if record.offset <= durable:
                    # Applied before a restart or rebalance, read again from an
                    # older committed offset: applying it twice could fire twice.
                    self._ctx.metrics.requests_skipped.inc()
                    continue
                part = changes[record.partition]
                in_step = part.request_offset if is_request else part.topic_offsets.get(record.topic)
                applied = durable if in_step is None else in_step
                if check_gap and applied >= 0 and record.offset > applied + 1 and self._gaps is not None:
                    start, end = applied + 1, record.offset
                    missing = await self._gaps.read(record.topic, record.partition, start, end)
                    log.warning(
                        "%s: offsets %d..%d were never delivered to this worker (skipped by the stream "
                        "during a rebalance?); read %d record(s) back",
                        record.where(), start, end - 1, len(missing),
                    )  # fmt: skip
                    self._ctx.metrics.requests_read_back.inc(len(missing))
                    queue.extendleft(reversed([*((m, False) for m in missing), (record, False)]))
                    continue
                if is_request:
                    part.request_offset = record.offset
                else:
                    part.topic_offsets[record.topic] = record.offset
                for request in parser.parse(record):
                    staged += 1
                    if isinstance(request, Schedule):
                        self._schedule(request, part, now, table)
                    elif isinstance(request, CancelRequest):
                        self._cancel(request, part)
                    else:
                        self._ctx.dispatch.reject(
                            request.record, request.reason, request.detail, request.timer_id, request.headers
                        )
                    if staged >= yielded + _YIELD_EVERY and self._windows:
                        # A precise window is sending timers at their millisecond: let it run
                        # between requests, also inside a batch record (it does not touch the tables).
                        yielded = staged
                        await asyncio.sleep(0)
                if staged >= self._ctx.config.fire_chunk_size:
                    await self._apply_staged(changes)
                    changes, staged, yielded = defaultdict(Changes), 0, 0
            await self._apply_staged(changes)

    async def _apply_staged(self, changes: dict[int, Changes]) -> None:
        """Write an ingest step to the changelog and the tables, then fire the timers it
        accepted already due, as a tick fires (they are in the table by then)."""
        await commit(self._ctx, changes)
        late = {p: self._ctx.tables(p).watermark for p, part in changes.items() if part.late}
        if late:
            await self._fire(late)
        self._ctx.metrics.scheduled.inc(sum(part.scheduled for part in changes.values()))
        windows = self._windows
        if windows is None:
            return
        for partition, part in changes.items():
            for timer_id, due_ms, key, stored in part.offers:
                if part.overlay.get(timer_id) == due_ms:  # not replaced or cancelled later in the step
                    windows.offer(partition, due_ms, key, stored)

    def owned(self, records: Sequence[SourceRecord]) -> Sequence[SourceRecord]:
        """Drop records of partitions revoked while they were buffered: the new owner reads them."""
        kept = [r for r in records if self._ctx.owns(r.partition)]
        if len(kept) < len(records):
            log.info("skipped %d records of partitions no longer assigned here", len(records) - len(kept))
        return kept

    def _current_due(self, part: Changes, table: PartitionTimers, timer_id: str) -> int | None:
        if timer_id in part.overlay:
            return part.overlay[timer_id]
        return table.due_of(timer_id)

    def _cancel(self, request: CancelRequest, part: Changes) -> None:
        partition = request.record.partition
        table = self._ctx.tables(partition)
        due = self._current_due(part, table, request.timer_id)
        if due is not None and self._windows is not None:
            key = table_key(due, request.timer_id)
            if self._windows.cancel(partition, due, key):
                if is_recurring(table, due, request.timer_id):
                    self._windows.withdraw(partition, due, key)  # sent, and the cancel ends its series
                else:
                    due = None  # sent by precise mode a moment ago; its deletion is on the way
        if due is None:
            self._ctx.metrics.cancel_missed.inc()
            self._ctx.dispatch.event(
                request.timer_id,
                Kind.CANCEL_MISSED,
                partition,
                reason="not pending: unknown or already fired",
            )
            return
        part.records.append((table_key(due, request.timer_id), None))
        part.overlay[request.timer_id] = None
        part.pending_delta -= 1
        self._ctx.metrics.cancelled.inc()
        self._ctx.dispatch.event(request.timer_id, Kind.CANCELLED, partition, due_ms=due)

    def _schedule(self, request: Schedule, part: Changes, now: int, table: PartitionTimers) -> None:
        """Stage a schedule (one already due is fired once the step is written: ``part.late``).

        Runs once per timer at bulk ingest rates (a FutureBatch): keep it lean.
        """
        partition = request.record.partition
        timer_id, due_ms = request.timer_id, request.due_ms
        if request.timer.future.HasField("recurrence") and reject_invalid(
            self._ctx, request.record, request.timer
        ):
            return
        old_due = self._current_due(part, table, timer_id)
        new_key = table_key(due_ms, timer_id)
        if old_due is not None and self._windows is not None:
            self._windows.withdraw(partition, old_due, table_key(old_due, timer_id))
        if old_due is not None and table_key(old_due, timer_id) != new_key:
            # Latest wins: the older version is removed, not fired.
            part.records.append((table_key(old_due, timer_id), None))
            part.overlay[timer_id] = None
            part.pending_delta -= 1
            old_due = None
        late = table.watermark >= 0 and due_ms <= table.watermark * 1000
        if late:
            config = self._ctx.config
            lateness_s = (now - due_ms) / 1000
            if lateness_s > config.max_lateness_s and config.late_policy is not LatePolicy.FIRE:
                detail = f"due {lateness_s:.1f}s ago, more than TIMERS_MAX_LATENESS_S={config.max_lateness_s}"
                if config.late_policy is LatePolicy.DLQ:
                    self._ctx.dispatch.reject(request.record, "too-late", detail, timer_id)
                else:
                    self._ctx.metrics.rejected.labels("too-late").inc()
                    self._ctx.dispatch.event(
                        timer_id,
                        Kind.REJECTED,
                        partition,
                        due_ms=due_ms,
                        reason=f"too-late (dropped): {detail}",
                    )
                return
            part.late = True
        value = request.timer.SerializeToString()
        part.records.append((new_key, value))
        part.overlay[timer_id] = due_ms
        if self._windows is not None:
            part.offers.append((timer_id, due_ms, new_key, value))
        if old_due is None:
            part.pending_delta += 1
        part.scheduled += 1
        self._ctx.dispatch.scheduled(
            timer_id, due_ms, partition, request.record.offset, request.timer.future.callBackTopic, now
        )
