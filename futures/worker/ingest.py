"""Request → table: a step of `timer-request` records applied to the partition tables.

:meth:`Ingest.accept` parses each record by its topic's format
(:mod:`futures.ingress.requests`) and stages what it asks — schedule, replace, cancel, or
a dead letter with the reason — per partition (:class:`~futures.worker.changelog.Changes`),
so later requests of a step see earlier ones before anything reaches the table. Every
``TIMERS_FIRE_CHUNK_SIZE`` timers, and at the end of the step, the staged changes are
written (:func:`~futures.worker.changelog.commit`); the timers accepted already due
(at or below their partition's watermark) are then fired from the table by the fire path,
as a tick fires them (:class:`~futures.worker.firing.Firing`).

Applying is idempotent: a record at or below its partition's last applied offset (kept
in the progress record) was applied before a restart or rebalance and is skipped; a
gap in the offsets (records Faust skipped during a rebalance) is read back and applied
in order (:mod:`futures.worker.gaps`), unless the consumer read past it without a record
(transaction markers, aborted transactions: :mod:`futures.worker.passed`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from itertools import islice, repeat
from operator import attrgetter

from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, Request, RequestParser, Schedule
from futures.worker.changelog import Ahead, Changes, commit
from futures.worker.columns import Decoder, Timers
from futures.worker.config import LatePolicy
from futures.worker.context import EngineContext
from futures.worker.gaps import GapReader, ReadPast
from futures.worker.series import is_recurring
from futures.worker.staging import REFUSE, STAGED, stage
from futures.worker.table import PartitionTimers, applying_record, table_key
from futures.worker.windows import Windows
from ktimers.config import IngressFormat
from ktimers.wire import TimerEvent

log = logging.getLogger(__name__)

Kind = TimerEvent.Kind
#: Precise mode: timers staged between two chances for the sending windows to run.
_YIELD_EVERY = 200

#: Fires each partition's timers due by a second (:meth:`Firing.fire`).
Fire = Callable[[dict[int, int]], Awaitable[object]]


class Ingest:
    def __init__(
        self,
        ctx: EngineContext,
        fire: Fire,
        windows: Windows | None,
        gaps: GapReader | None,
        read_past: ReadPast | None = None,
    ) -> None:
        self._ctx = ctx
        self._fire = fire
        self._windows = windows  # precise mode's, or None
        self._gaps = gaps  # reads back request records the stream skipped
        self._read_past = read_past  # which holes hold no request (transaction markers)

    async def accept(self, records: Sequence[SourceRecord]) -> None:
        """Accept a batch of request records of any ingress topic; durable when this returns.

        A record may hold many timers (a ``FutureBatch``): every
        ``fire_chunk_size`` timers the records parsed so far are made durable,
        so one call never holds more than that in memory. The step's progress records may
        still be on their way: the next write to their partitions waits for them
        (:mod:`futures.worker.progress`).
        """
        async with self._ctx.lock:
            records = self.owned(records)
            step_ends = {(r.partition, r.topic): r.offset for r in records}  # in offset order
            now = self._ctx.clock()
            parser = RequestParser(self._ctx.config.parse_limits, now)
            decoder = Decoder(parser.context)
            topics = self._ctx.config.parse_limits.topics
            native = {t for t in set(map(_topic, records)) if topics.format_of(t) is IngressFormat.NATIVE}
            changes: dict[int, Changes] = defaultdict(Changes)
            ahead = Ahead()  # the broker takes in the step's first records while the rest are staged
            staged = 0
            request_topic = self._ctx.config.common.topics.request
            queue = deque(zip(records, repeat(True)))
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
                if (
                    check_gap
                    and applied >= 0
                    and record.offset > applied + 1
                    and self._gaps is not None
                    and not self._holds_no_request(record, applied + 1)
                ):
                    start, end = applied + 1, record.offset
                    self._ctx.metrics.request_gaps.labels("read-back").inc()
                    missing = await self._gaps.read(record.topic, record.partition, start, end)
                    log.warning(
                        "%s: offsets %d..%d were never delivered to this worker (skipped by the stream "
                        "during a rebalance?); read %d record(s) back",
                        record.where(), start, end - 1, len(missing),
                    )  # fmt: skip
                    self._ctx.metrics.requests_read_back.inc(len(missing))
                    queue.extendleft(reversed([*((m, False) for m in missing), (record, False)]))
                    continue
                timers, taken = None, 0
                if record.topic in native:
                    run = _run(record, queue)
                    if len(run) == 1:
                        # A run's bookkeeping costs a record alone more than it saves
                        # (docs/PERFORMANCE.md#accepting-a-timer).
                        timers, taken = decoder.decode(record), 1
                    else:
                        timers, taken = decoder.decode_run(run, self._ctx.config.fire_chunk_size - staged)
                if timers is not None:
                    # The common case, records of valid timers: staged column by column, with
                    # the records after this one that hold only valid timers too.
                    if taken > 1:
                        record = run[taken - 1]
                        for _ in repeat(None, taken - 1):
                            queue.popleft()
                    _note_offset(part, record, is_request, step_ends)
                    staged = await self._schedule(timers, part, now, table, staged)
                else:
                    _note_offset(part, record, is_request, step_ends)
                    staged = await self._stage_parsed(parser.parse(record), part, now, table, staged)
                ahead.produce(self._ctx, changes)
                if staged >= self._ctx.config.fire_chunk_size:
                    await self._apply_staged(changes, ahead)
                    changes, ahead, staged = defaultdict(Changes), Ahead(), 0
            await self._apply_staged(changes, ahead)

    def _holds_no_request(self, record: SourceRecord, start: int) -> bool:
        """Whether the consumer read past the offsets from ``start`` to ``record``'s without a record
        (transaction markers, aborted transactions): no round trip under the lock for them, one
        per transaction a producer commits."""
        past = self._read_past
        if past is None or not past.holds_no_request(record.topic, record.partition, start, record.offset):
            return False
        self._ctx.metrics.request_gaps.labels("no-request").inc()
        return True

    async def _stage_parsed(
        self, requests: list[Request], part: Changes, now: int, table: PartitionTimers, staged: int
    ) -> int:
        """Stage what the general parser made of a record; returns ``staged`` plus its requests."""
        for request in requests:
            if isinstance(request, Schedule):
                timer, record = request.timer, request.record
                timer_id = timer.future.id
                one = Timers(
                    [record],
                    [timer_id],
                    [timer_id.encode()],
                    [timer.future.due_ms],
                    [timer.future.callBackTopic],
                    [timer.SerializeToString()],
                )
                staged = await self._schedule(one, part, now, table, staged)
                continue
            staged += 1
            if isinstance(request, CancelRequest):
                self._cancel(request, part)
            else:
                self._ctx.dispatch.reject(
                    request.record, request.reason, request.detail, request.timer_id, request.headers
                )
            staged = await self._pause(staged)
        return staged

    async def _pause(self, staged: int) -> int:
        if staged % _YIELD_EVERY == 0 and self._windows is not None:
            # A precise window is sending timers at their millisecond: let it run
            # between requests, also inside a batch record (it does not touch the tables).
            await asyncio.sleep(0)
        return staged

    async def _apply_staged(self, changes: dict[int, Changes], ahead: Ahead) -> None:
        """Write an ingest step to the changelog (``ahead``: what of it is produced already) and
        the tables, then fire the timers it accepted already due, as a tick fires (they are in
        the table by then)."""
        await commit(self._ctx, changes, ahead=ahead)
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
        owns = self._ctx.owns
        revoked = {p for p in set(map(_partition, records)) if not owns(p)}
        if not revoked:
            return records
        kept = [r for r in records if r.partition not in revoked]
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

    async def _schedule(
        self, timers: Timers, part: Changes, now: int, table: PartitionTimers, staged: int
    ) -> int:
        """Stage ``timers`` (of one partition), in order; returns ``staged`` plus their number.

        Latest wins: an older version of a timer, in the table or staged earlier in the
        step, is removed, not fired. A timer already due (at or below the partition's
        watermark) is fired once the step is written (``part.late``), unless it is later than
        ``TIMERS_MAX_LATENESS_S`` allows. The loop over the timers is compiled
        (:func:`~futures.worker.staging.stage`); it hands back here what is more than
        staging: a timer to refuse, and precise mode's pauses.
        """
        sources = timers.records
        partition = sources[0].partition
        windows = self._windows
        config = self._ctx.config
        refuse_late = config.late_policy is not LatePolicy.FIRE
        late_ms = table.watermark * 1000 if table.watermark >= 0 else -1
        ids, id_bytes = timers.ids, timers.id_bytes
        # Each id's version in the table, looked up together: the table changes only when the
        # step is written; versions staged earlier in the step are in the overlay. New ids
        # (``kt-ids: new``) have none: the lookup would only find nothing.
        # Unless the record was applied before and its progress was lost: its timers are there.
        last = sources[-1]
        if timers.new_ids and not table.may_hold(last.topic, last.offset):
            in_table: list[int | None] = [None] * len(id_bytes)
            table.note_put_unlooked(id_bytes)  # an id drawn again may be one fired, not swept yet
        elif len(id_bytes) > 1:
            in_table = table.dues_of_ids(id_bytes)
        else:
            in_table = [table.due_of_id(id_bytes[0])]
        # The SCHEDULED events go in runs: the timers since ``run_from``, all accepted
        # (one refused as too late ends a run, its REJECTED event after it).
        run_from = at = 0
        while at < len(ids):
            at, staged, delta, late, ended = stage(
                timers, in_table, at, part, windows, partition,
                late_ms, now, config.max_lateness_s, refuse_late, staged, _YIELD_EVERY,
            )  # fmt: skip
            part.pending_delta += delta
            part.late = part.late or late
            if ended == REFUSE:
                self._scheduled(timers, run_from, at, now, part)
                self._refuse_late(sources[at], ids[at], timers.due_ms[at], now, partition)
                at = run_from = at + 1
            if ended != STAGED and windows is not None and staged % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let precise windows send (see _pause)
        self._scheduled(timers, run_from, len(ids), now, part)
        return staged

    def _scheduled(self, timers: Timers, start: int, end: int, now: int, part: Changes) -> None:
        """The SCHEDULED events of ``timers[start:end]``, all accepted."""
        if start >= end:
            return
        part.scheduled += end - start
        sources = timers.records[start:end]
        self._ctx.dispatch.scheduled(
            sources[0].partition,
            now,
            timers.ids[start:end],
            timers.due_ms[start:end],
            list(map(_offset, sources)),
            timers.callback_topics[start:end],
        )

    def _refuse_late(
        self, record: SourceRecord, timer_id: str, due_ms: int, now: int, partition: int
    ) -> None:
        """Report a timer refused as too late: dead-lettered or dropped, as the policy says."""
        config = self._ctx.config
        lateness_s = (now - due_ms) / 1000
        detail = f"due {lateness_s:.1f}s ago, more than TIMERS_MAX_LATENESS_S={config.max_lateness_s}"
        if config.late_policy is LatePolicy.DLQ:
            self._ctx.dispatch.reject(record, "too-late", detail, timer_id)
        else:
            self._ctx.metrics.rejected.labels("too-late").inc()
            self._ctx.dispatch.event(
                timer_id,
                Kind.REJECTED,
                partition,
                due_ms=due_ms,
                reason=f"too-late (dropped): {detail}",
            )


#: A record's fields, read in C by ``map``.
_offset = attrgetter("offset")
_partition = attrgetter("partition")
_topic = attrgetter("topic")


#: At most this many records, and about this many bytes of them, are decoded together
#: (:meth:`Decoder.decode_run`): enough to pay a step's checks once for hundreds of one-``Future``
#: records, and the staged timers stay within about one run of ``TIMERS_FIRE_CHUNK_SIZE``.
_RUN_RECORDS = 500
_RUN_BYTES = 256 * 1024


def _run(record: SourceRecord, queue: deque[tuple[SourceRecord, bool]]) -> list[SourceRecord]:
    """``record`` and the records queued right after it that follow it in its partition (the
    next offsets of its topic and partition), as many as one run takes."""
    run = [record]
    offset, partition, topic = record.offset, record.partition, record.topic
    volume = len(record.value or b"")
    for follower, _ in islice(queue, _RUN_RECORDS - 1):
        offset += 1
        if (
            follower.offset != offset
            or follower.partition != partition
            or follower.topic != topic
            or volume >= _RUN_BYTES
        ):
            break
        run.append(follower)
        volume += len(follower.value or b"")
    return run


def _note_offset(
    part: Changes, record: SourceRecord, is_request: bool, step_ends: dict[tuple[int, str], int]
) -> None:
    """``record`` is applied in this step: its offset is its topic's progress. The write's first
    record of its topic says how far the step goes (``m:applying:``), before any of its timers."""
    if is_request:
        part.request_offset = record.offset
    else:
        part.topic_offsets[record.topic] = record.offset
    if record.topic not in part.applying:
        # Read back from a gap, a record may lie past what the step was handed: never below it.
        end = max(step_ends.get((record.partition, record.topic), record.offset), record.offset)
        part.applying[record.topic] = end
        part.records.append(applying_record(record.topic, end))
