"""The join of requests and ticks: request → table → tick → dispatch.

* :meth:`TimerEngine.ingest` takes a batch of `timer-request` records and
  writes them to the partition tables (schedule, replace, cancel), or fires
  them at once when their due time has already passed the partition's watermark.
* :meth:`TimerEngine.advance` takes a batch of ticks; for each partition whose
  clock moved to second s it fires every timer due by s (one range scan; all
  partitions' timers as one stream in due order), then deletes them and moves
  the watermark to s. Ticks are noted as soon as they are fetched
  (:meth:`TimerEngine.note_ticks`), so that they need not wait for requests.
* What goes out besides the changelog — callbacks, `timer-events`, dead
  letters — is :mod:`futures.worker.dispatch`'s; precise mode's per-millisecond
  windows are :mod:`futures.worker.windows`'.

Durability order, which is what makes a crash lose nothing:
callbacks are flushed before their timers' tombstones are written; changelog
records are flushed before the local table changes; and the consumed offsets
are committed by Faust only after these coroutines return.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, RequestParser, Schedule
from futures.worker.callbacks import Callback, Lookahead, prepare
from futures.worker.config import LatePolicy, WorkerConfig
from futures.worker.destinations import AnyTopic, TopicDirectory
from futures.worker.dispatch import Dispatcher, Sending
from futures.worker.gaps import GapReader
from futures.worker.join import NoBacklog, RequestFrontier, WaitingTicks
from futures.worker.kafka import Deliveries, KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import WorkerStatus
from futures.worker.table import (
    PartitionTimers,
    Record,
    due_of_key,
    progress_record,
    table_key,
    topic_progress_record,
)
from futures.worker.windows import Item, Window, Windows
from ktimers.deadletter import short
from ktimers.logs import ThrottledLog
from ktimers.wire import (
    TimerEvent,
    decode_tick,
)

log = logging.getLogger(__name__)

Kind = TimerEvent.Kind
#: Precise mode: timers staged by ingest between two chances for the sending windows to run.
_WINDOW_YIELD_EVERY = 200
#: Precise mode: timers a window's opening reads and prepares between two chances for the sending
#: windows to run (~5 µs each: a slice stays near a quarter of a millisecond).
_WINDOW_OPEN_SLICE = 50
#: Timers of a tick's first piece at most (see TimerEngine._fire_due).
_FIRST_PIECE = 2000
#: Precise mode: timers a window sends between two settlements (delivery checked, events, deletion).
_WINDOW_SETTLE_EVERY = 500
#: Second mode: timers prepared ahead of their tick at a time, holding the engine lock (~2 ms).
_PREPARE_SLICE = 500


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Changes:
    """Changelog records and progress of one partition, not yet written."""

    records: list[Record] = field(default_factory=list)
    pending_delta: int = 0
    watermark: int | None = None  # new watermark (epoch s), when the clock moved
    request_offset: int | None = None  # last `timer-request` offset applied, when requests were
    # Last offset applied of each other ingress topic (TIMERS_INGRESS_TOPICS).
    topic_offsets: dict[str, int] = field(default_factory=dict)
    scheduled: int = 0  # timers accepted into the table, counted once the write is durable
    # Ids touched in this batch → due ms (None = removed): later requests in the
    # same batch must see earlier ones before anything reaches the table.
    overlay: dict[str, int | None] = field(default_factory=dict)
    # Precise mode: timers put into the table, for their window once the write is durable:
    # (id, due ms, table key, StoredTimer bytes).
    offers: list[tuple[str, int, bytes, bytes]] = field(default_factory=list)
    #: A timer already due was accepted: fire the partition once the step is written.
    late: bool = False


class _DueScan:
    """One partition's timers due by a tick, read from the table in pieces, in key (= due) order."""

    def __init__(self, partition: int, table: PartitionTimers, limit_ms: int) -> None:
        self.partition = partition
        self._table = table
        self._limit_ms = limit_ms
        self._items: list[tuple[bytes, bytes]] = []
        self.more = True  # the last read was full: the table may hold more due timers
        self.last = b""  # the last key read: the next read starts past it

    def read(self, count: int) -> None:
        """Read on, up to ``count`` due timers in hand.

        Topped up, not read only once all were taken: a piece is the timers up to the
        first partition's last key read, and the other partitions' leftovers alone
        would make a piece of a few dozen timers, each piece costing broker round trips.
        """
        want = count - len(self._items)
        if want <= 0 or not self.more:
            return
        items = self._table.due_items(self._limit_ms, want, after=self.last or None)
        self.more = len(items) == want
        if items:
            self._items.extend(items)
            self.last = items[-1][0]

    def take(self, bound: bytes | None) -> list[tuple[bytes, int, bytes]]:
        """The timers in hand with keys up to ``bound`` (all of them if None), as (key, partition, value)."""
        items = self._items
        end = len(items) if bound is None else bisect.bisect_right(items, bound, key=_first)
        taken, self._items = items[:end], items[end:]
        p = self.partition
        return [(key, p, value) for key, value in taken]


@dataclass
class _Fired:
    """What a firing scanned, per partition: up to when (epoch ms), and the earliest timer it
    kept for a retry (due epoch ms)."""

    limits: dict[int, int] = field(default_factory=dict)
    kept: dict[int, int] = field(default_factory=dict)


def _first(item: tuple[bytes, bytes]) -> bytes:
    return item[0]


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
        status: WorkerStatus | None = None,
        gaps: GapReader | None = None,
        callback_topics: TopicDirectory | None = None,
        frontier: RequestFrontier | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.config = config
        self._tables = tables
        self._writer = writer
        self._gaps = gaps  # reads back request records the stream skipped (futures/worker/gaps.py)
        self.metrics = metrics
        self._clock = clock
        self._topics = config.common.topics
        self._owns = owns
        # Ingest and firing both mutate the tables; one at a time keeps the
        # overlay, the watermark checks and the changelog order consistent.
        # The store shares it, to close revoked partitions between mutations.
        self._lock = lock or asyncio.Lock()
        self.status = status or WorkerStatus()  # what the admin API shows
        self.dispatch = Dispatcher(
            self._topics, writer, metrics, self.status, clock, callback_topics or AnyTopic()
        )
        self._windows = Windows(config.fire_chunk_size, self._fatal)  # precise mode
        #: Told of a failure that must stop the worker (durable writes failed): see _fatal.
        self.on_fatal = on_fatal
        self._failure: BaseException | None = None
        # Second mode: the next second's callbacks, prepared between ticks (_prepare_ahead).
        self._lookahead = Lookahead(config.fire_chunk_size)
        self._ahead: dict[int, int] = {}  # partition → the second its clock is at, to prepare past
        self._ahead_task: asyncio.Task[None] | None = None
        # Ticks not fired yet: waiting for the engine, or for older requests (futures/worker/join.py).
        self._waiting = WaitingTicks(
            frontier or NoBacklog(),
            config.join_max_wait_s,
            on_waited=metrics.join_wait.observe,
            on_bound=metrics.join_wait_bound.inc,
        )
        self._woken = asyncio.Event()
        self._ticks_log = ThrottledLog(log)

    # -- request → table -------------------------------------------------------

    async def ingest(self, records: Sequence[SourceRecord]) -> None:
        """Apply a batch of request records of any ingress topic; durable when this returns.

        A record may hold many timers (a ``FutureBatch``): every
        ``fire_chunk_size`` timers the records parsed so far are made durable,
        so one call never holds more than that in memory.
        """
        async with self._lock:
            records = self._owned(records)
            now = self._clock()
            parser = RequestParser(self.config.parse_limits, now)
            changes: dict[int, _Changes] = defaultdict(_Changes)
            staged = yielded = 0
            request_topic = self._topics.request
            queue = deque((record, True) for record in records)
            while queue:
                record, check_gap = queue.popleft()
                table = self._tables(record.partition)
                is_request = record.topic == request_topic
                durable = table.request_offset if is_request else table.topic_offset(record.topic)
                if record.offset <= durable:
                    # Applied before a restart or rebalance, read again from an
                    # older committed offset: applying it twice could fire twice.
                    self.metrics.requests_skipped.inc()
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
                    self.metrics.requests_read_back.inc(len(missing))
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
                        self.dispatch.reject(
                            request.record, request.reason, request.detail, request.timer_id, request.headers
                        )
                    if staged >= yielded + _WINDOW_YIELD_EVERY and self._windows:
                        # A precise window is sending timers at their millisecond: let it run
                        # between requests, also inside a batch record (it does not touch the tables).
                        yielded = staged
                        await asyncio.sleep(0)
                if staged >= self.config.fire_chunk_size:
                    await self._apply_staged(changes)
                    changes, staged, yielded = defaultdict(_Changes), 0, 0
            await self._apply_staged(changes)

    async def _apply_staged(self, changes: dict[int, _Changes]) -> None:
        """Write an ingest step to the changelog and the tables, then fire the timers it
        accepted already due, as a tick fires (they are in the table by then)."""
        await self._commit(changes)
        late = {p: self._tables(p).watermark for p, part in changes.items() if part.late}
        if late:
            await self._fire(late)
        self.metrics.scheduled.inc(sum(part.scheduled for part in changes.values()))
        for partition, part in changes.items():
            for timer_id, due_ms, key, stored in part.offers:
                if part.overlay.get(timer_id) == due_ms:  # not replaced or cancelled later in the step
                    self._windows.offer(partition, due_ms, key, stored)

    def _owned(self, records: Sequence[SourceRecord]) -> Sequence[SourceRecord]:
        """Drop records of partitions revoked while they were buffered: the new owner reads them."""
        kept = [r for r in records if self._owns(r.partition)]
        if len(kept) < len(records):
            log.info("skipped %d records of partitions no longer assigned here", len(records) - len(kept))
        return kept

    def _current_due(self, part: _Changes, table: PartitionTimers, timer_id: str) -> int | None:
        if timer_id in part.overlay:
            return part.overlay[timer_id]
        return table.due_of(timer_id)

    def _cancel(self, request: CancelRequest, part: _Changes) -> None:
        partition = request.record.partition
        table = self._tables(partition)
        due = self._current_due(part, table, request.timer_id)
        if due is not None and self._windows.cancel(partition, due, table_key(due, request.timer_id)):
            due = None  # sent by precise mode a moment ago; its deletion is on the way
        if due is None:
            self.metrics.cancel_missed.inc()
            self.dispatch.event(
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
        self.dispatch.event(request.timer_id, Kind.CANCELLED, partition, due_ms=due)

    def _schedule(self, request: Schedule, part: _Changes, now: int, table: PartitionTimers) -> None:
        """Stage a schedule (one already due is fired once the step is written: ``part.late``).

        Runs once per timer at bulk ingest rates (a FutureBatch): keep it lean.
        """
        partition = request.record.partition
        timer_id, due_ms = request.timer_id, request.due_ms
        old_due = self._current_due(part, table, timer_id)
        new_key = table_key(due_ms, timer_id)
        if old_due is not None and self._windows:
            self._windows.withdraw(partition, old_due, table_key(old_due, timer_id))
        if old_due is not None and table_key(old_due, timer_id) != new_key:
            # Latest wins: the older version is removed, not fired.
            part.records.append((table_key(old_due, timer_id), None))
            part.overlay[timer_id] = None
            part.pending_delta -= 1
            old_due = None
        late = table.watermark >= 0 and due_ms <= table.watermark * 1000
        if late:
            lateness_s = (now - due_ms) / 1000
            if lateness_s > self.config.max_lateness_s and self.config.late_policy is not LatePolicy.FIRE:
                detail = (
                    f"due {lateness_s:.1f}s ago, more than TIMERS_MAX_LATENESS_S={self.config.max_lateness_s}"
                )
                if self.config.late_policy is LatePolicy.DLQ:
                    self.dispatch.reject(request.record, "too-late", detail, timer_id)
                else:
                    self.metrics.rejected.labels("too-late").inc()
                    self.dispatch.event(
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
        if self._windows:
            part.offers.append((timer_id, due_ms, new_key, value))
        if old_due is None:
            part.pending_delta += 1
        part.scheduled += 1
        self.dispatch.scheduled(
            timer_id, due_ms, partition, request.record.offset, request.timer.future.callBackTopic, now
        )

    # -- tick → dispatch -------------------------------------------------------

    def note_ticks(self, ticks: Sequence[SourceRecord]) -> None:
        """Take a batch of ticks: each partition's clock is to move to its highest second.

        Several oscillators tick every partition every second; a tick at or below the
        clock, or a copy of one waiting, moves nothing. The clock moves when
        :meth:`fire_ready` runs, as far as the partition's requests allow (see
        :mod:`futures.worker.join`).
        """
        duplicates = 0
        for record in self._owned(ticks):
            second, source = decode_tick(record.key, record.value)
            if second is None:
                self.metrics.ticks.labels("invalid").inc()
                self._ticks_log.warning(
                    "ignoring tick %s with key %s: not an epoch second",
                    record.where(),
                    short(repr(record.key), 80),
                )
                continue
            partition = record.partition
            self.status.tick(partition, second, source)
            if not self._waiting.note(partition, second, self._tables(partition).watermark):
                duplicates += 1
        self.metrics.ticks.labels("duplicate").inc(duplicates)

    async def advance(self, ticks: Sequence[SourceRecord]) -> None:
        """Take a batch of ticks and fire what they make due (:meth:`note_ticks`, :meth:`fire_ready`)."""
        self.note_ticks(ticks)
        await self.fire_ready()

    def wake(self) -> None:
        """Ticks came, or requests were applied: :meth:`run` looks at what may fire now."""
        self._woken.set()

    async def run(self, poll_s: float = 0.5) -> None:
        """Fire what the waiting ticks allow whenever woken, and every ``poll_s`` seconds
        (a tick that waits for requests fires at the latest once TIMERS_JOIN_MAX_WAIT_S is up)."""
        while True:
            try:
                await asyncio.wait_for(self._woken.wait(), poll_s)
            except TimeoutError:
                pass
            self._woken.clear()
            await self.fire_ready()

    async def fire_ready(self) -> None:
        """Move the clocks the waiting ticks allow, firing what comes due."""
        if not self._waiting:
            return
        if self.config.precise:
            # The previous precise window ends at the tick's very second: let it finish
            # sending and deleting, so this tick's scan does not see its timers.
            await self._windows.done(self._waiting.seconds())
        async with self._lock:
            targets = self._claim_ticks()
            if not targets:
                return
            moved = await self._fire(targets)
            if self.config.precise:
                for partition, second in moved.items():
                    await self._open_windows(partition, second)
            else:
                self._look_ahead(moved)
        self.metrics.ticks.labels("advanced").inc(len(moved))

    async def _fire(self, targets: dict[int, int]) -> dict[int, int]:
        """Fire each partition's timers due by its target second (epoch s), and move its clock
        there (a late timer's partition: to where it is); the clocks moved. Under the lock.

        The one way timers fire in second mode, whether a tick made them due or they were
        accepted late. A timer whose callback failed transiently stays in the table, below
        the clock: the table's low mark makes the next firing of its partition read it again.
        """
        changes = {partition: _Changes() for partition in targets}
        fired = await self._fire_due(targets, changes)
        for partition, target in targets.items():  # joined ticks were added to ``targets``
            if target > self._tables(partition).watermark:
                changes[partition].watermark = target
        await self._commit(changes)
        for partition, limit_ms in fired.limits.items():
            self._tables(partition).scanned(limit_ms, fired.kept.get(partition))
        return {p: part.watermark for p, part in changes.items() if part.watermark is not None}

    def _claim_ticks(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Partition → the second its clock moves to now (of ``partitions``, or all with waiting ticks)."""
        # Revoked by a rebalance while the tick waited: the new owner has ticks of its own.
        self._waiting.drop([p for p in self._waiting.seconds() if not self._owns(p)])
        targets: dict[int, int] = {}
        for partition, second in self._waiting.claim(partitions).items():
            target = self._trusted_second(partition, second)
            if target is not None:
                targets[partition] = target
        return targets

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

    async def _fire_due(self, targets: dict[int, int], changes: dict[int, _Changes]) -> _Fired:
        """Fire the timers due in each partition by its target second (epoch s), never past
        this worker's clock. Clock moves that arrive meanwhile join (second mode): added to
        ``targets`` and ``changes``.

        All partitions' timers go out as one stream in due order, not one partition
        after another: the timers a tick made latest go first, wherever they live.
        The stream goes in pieces of a third of ``TIMERS_FIRE_CHUNK_SIZE``, the first smaller
        (each partition read in its share of a piece, sent up to the point every partition was read to),
        overlapped: while one piece's callbacks are on their way to the broker, the piece
        before is settled and the one before that committed (its tombstones written and
        deleted), so the broker's round trips are not waited for one after another. What is
        sent and not yet deleted — what a crash would send again — stays one chunk.
        """
        depth = 3 if self.config.fire_chunk_size >= 3 else 1
        piece = self.config.fire_chunk_size // depth
        fired = _Fired()
        scans = [self._scan(partition, second, fired) for partition, second in targets.items()]
        flight: deque[Sending] = deque()
        committing: asyncio.Task[None] | None = None
        # The first piece is small: the tick's first callbacks leave before a whole piece is read.
        size = min(piece, _FIRST_PIECE)
        try:
            while True:
                if not all(self._owns(scan.partition) for scan in scans):
                    # Revoked meanwhile (revoke): nothing more of it is sent; the new owner fires it.
                    scans = [scan for scan in scans if self._owns(scan.partition)]
                share = max(size // max(len(scans), 1), 1)
                size = piece
                for scan in scans:
                    scan.read(share)
                # Past the first last-read key of a partition that may hold more, some
                # partition's timers are not in hand yet: they wait for the next round.
                bound = min((scan.last for scan in scans if scan.more), default=None)
                batch = sorted(item for scan in scans for item in scan.take(bound))  # runs merged: Timsort
                if batch:
                    # Built as they go out, but for those prepared before the tick (Lookahead).
                    flight.append(self.dispatch.send(self._lookahead.take(batch), self._clock()))
                    if len(flight) < depth - 1:
                        continue  # the next piece goes out before this one is settled
                if not flight:
                    return fired
                sending = flight.popleft()
                outcome = await self.dispatch.confirm(sending)
                await self.dispatch.deliver_dead_letters(outcome)
                sent = sending.callbacks
                done = sent if len(outcome.done) == len(sent) else [sent[i] for i in outcome.done]
                tombstones: dict[int, list[Record]] = defaultdict(list)
                for callback in done:
                    tombstones[callback.partition].append((callback.key, None))
                for p, records in tombstones.items():
                    changes[p].records.extend(records)
                    changes[p].pending_delta -= len(records)
                if outcome.transient:
                    # Kept in the table: the next tick retries them, and the scans here read on past them.
                    self.metrics.dispatch_retries.inc(len(outcome.transient))
                    for i in outcome.transient:
                        callback = sent[i]
                        kept = fired.kept.get(callback.partition)
                        if kept is None or callback.due_ms < kept:
                            fired.kept[callback.partition] = callback.due_ms
                if not self.config.precise:
                    # The other partitions' ticks of this second often come a fetch later: they
                    # join this firing instead of waiting for all of it (and its commit) to end.
                    waiting = [p for p in self._waiting.seconds() if p not in targets]
                    joined = self._claim_ticks(waiting) if waiting else {}
                    for partition, second in joined.items():
                        targets[partition] = second
                        changes[partition] = _Changes()
                        scans.append(self._scan(partition, second, fired))
                if flight or any(scan.more for scan in scans):
                    # A large second: this piece is made durable while the next go out (one commit
                    # at a time, in order); the last piece is the caller's, with the clock move.
                    if committing is not None:
                        await committing
                    piece_changes = dict(changes)
                    for partition in changes:
                        changes[partition] = _Changes()
                    committing = asyncio.ensure_future(self._commit(piece_changes))
                    if depth == 1:  # a chunk too small to share: one piece at a time
                        await committing
                        committing = None
        finally:
            if committing is not None:
                await committing

    def _scan(self, partition: int, second: int, fired: _Fired) -> _DueScan:
        """A scan of ``partition``'s timers due by ``second``, and never past this worker's clock:
        the clock of a partition inherited from another worker may be ahead of ours."""
        limit_ms = min(second * 1000, self._clock() + self.config.clock_tolerance_ms)
        fired.limits[partition] = limit_ms
        return _DueScan(partition, self._tables(partition), limit_ms)

    def _look_ahead(self, moved: Mapping[int, int]) -> None:
        """Second mode: prepare the callbacks each partition's next tick fires, its clock just
        moved to the second in ``moved`` (see :class:`~futures.worker.callbacks.Lookahead`)."""
        for partition in self._lookahead.partitions():
            if partition in moved or not self._owns(partition):
                self._lookahead.drop(partition)  # fired by now, or the partition went elsewhere
        self._ahead.update(moved)
        if self._ahead and (self._ahead_task is None or self._ahead_task.done()):
            self._ahead_task = asyncio.ensure_future(self._prepare_ahead())

    async def prepared(self) -> None:
        """Wait until what :meth:`_look_ahead` started is prepared (tests and benchmarks)."""
        if self._ahead_task is not None:
            await self._ahead_task

    async def _prepare_ahead(self) -> None:
        """Prepare the timers due in the second after each clock of ``self._ahead``, in slices,
        while the budget allows: ticks and requests go on between the slices."""
        lookahead = self._lookahead
        try:
            while self._ahead:
                partition, second = self._ahead.popitem()
                after: bytes | None = None
                while lookahead.room():
                    async with self._lock:
                        # Revoked, or its clock moved on meanwhile (that move queued its own turn).
                        if not self._owns(partition) or self._tables(partition).watermark != second:
                            break
                        count = min(_PREPARE_SLICE, lookahead.room())
                        due = self._tables(partition).due_items((second + 1) * 1000, count, after=after)
                        lookahead.fill(partition, due)
                    if len(due) < count:
                        break
                    after = due[-1][0]
                    await asyncio.sleep(0)
        except Exception:
            # Only a head start is lost: the tick builds what is not prepared, and meets
            # the same problem, if it is one, where it is handled today.
            log.warning("preparing the next second's callbacks failed", exc_info=True)
            self._ahead.clear()

    # -- revocation and failure --------------------------------------------------

    def revoke(self, partitions: Iterable[int]) -> None:
        """Stop at once what this worker would still send of ``partitions``, revoked by a rebalance.

        Call it as the revocation is reported, before the group rejoins (so before a new
        owner fires them), with ``owns`` saying False for them from then on. Their precise
        windows send nothing more: what they did not settle stays in the table, so the new
        owner fires it, a timer sent just before the revocation maybe once more (callbacks
        carry ``kt-id`` and ``kt-due-ms`` for receivers to deduplicate). The callbacks
        prepared ahead for them are dropped.
        """
        revoked = set(partitions)
        self._windows.revoke(revoked)
        for partition in revoked:
            self._lookahead.drop(partition)
            self._ahead.pop(partition, None)

    def _fatal(self, exc: BaseException) -> None:
        """A precise window or its settle failed: its durable writes failed, the worker must stop.

        Until it has stopped, this engine owns nothing: from now on no window sends and no
        tick or request is applied, so the failed window's timers are not sent again here
        (they stay in the table: the restarted worker sends them).
        """
        if self._failure is not None:
            if exc is not self._failure:  # the failed settle's window ends with the same one
                log.warning("a precise window failed too while the worker stops: %r", exc)
            return
        self._failure = exc
        log.critical("a precise window failed, stopping the worker: %r", exc, exc_info=exc)
        self._owns = lambda partition: False
        self.revoke([*self._windows.partitions(), *self._lookahead.partitions(), *self._ahead])
        if self.on_fatal is not None:
            self.on_fatal(exc)

    # -- precise mode ------------------------------------------------------------

    async def _open_windows(self, partition: int, second: int) -> None:
        """Open windows ``second + 1`` and ``second + 2`` where they are not open (called under
        the lock, the watermark at ``second``): each is sending a second before its timers are due.

        The scan goes in slices, letting the open windows send between them: a second of
        10 k timers takes tens of milliseconds to read, longer than a timer may wait.
        """
        table = self._tables(partition)
        most = self._windows.max_timers
        for window in (second + 1, second + 2):
            if not self._owns(partition):
                return  # revoked while the tick fired, or while the window before was read
            if self._windows.is_open(partition, window):
                continue
            items: list[Item] = []
            after: bytes | None = None
            while True:
                count = min(_WINDOW_OPEN_SLICE, most - len(items))
                due = table.due_items(window * 1000, count, after=after, from_ms=(window - 1) * 1000 + 1)
                items.extend([(due_of_key(key), key, prepare(key, partition, value)) for key, value in due])
                if len(due) < count or len(items) >= most:
                    break
                after = due[-1][0]
                await asyncio.sleep(0)
            self._windows.open(partition, window, items, self._send_window)

    async def _send_window(self, window: Window) -> None:
        """Send each timer of ``window`` at its due millisecond, then delete what was sent.

        Runs without the lock while it waits, so ingest goes on: a timer accepted
        meanwhile joins (``Windows.offer``), one cancelled or replaced is skipped
        (``window.removed``). Never early: a timer is sent when this worker's clock
        has reached its due time. Never after its partition was revoked (:meth:`revoke`).
        A failure ends it with the failure, every settle's awaited first.
        """
        end_ms = window.second * 1000
        partition = window.partition
        # Sent timers are settled and deleted a few hundred at a time, beside the sending:
        # all at once at the end of the second, that work (tens of ms a thousand timers)
        # would hold up the next window's first timers.
        settling: list[asyncio.Task[None]] = []
        try:
            deliveries = Deliveries()
            topics: dict[str, KafkaError | None] = {}  # callback topics looked up, for this window
            sent: list[tuple[Callback, int]] = []  # and when each was sent
            while True:
                # Checked again before each timer, with no await until it is produced.
                if window.revoked or not self._owns(partition):
                    sent = []  # left in the table, for the new owner: at least once
                    break
                next_due = window.next_due()
                wait_ms = (end_ms if next_due is None else next_due) - self._clock()
                if wait_ms > 0:
                    await window.wait(wait_ms / 1000)  # an earlier timer offered meanwhile cuts it short
                    continue
                if next_due is None:
                    break  # the second is over: a timer offered from now on is the next tick's
                callback = window.pop()
                if callback is None:
                    continue  # cancelled or replaced meanwhile
                fired_ms = self._clock()
                fired = str(fired_ms).encode()
                self.dispatch.produce_callback(callback, fired, deliveries, len(sent), topics)
                window.sent.add(callback.key)
                sent.append((callback, fired_ms))
                if len(sent) >= _WINDOW_SETTLE_EVERY:
                    settling.append(asyncio.create_task(self._settle_sent(window, sent, deliveries)))
                    deliveries, sent = Deliveries(), []
            window.closing = True
            if sent:
                settling.append(asyncio.create_task(self._settle_sent(window, sent, deliveries)))
        finally:
            window.closing = True
            # Open until its timers are deleted: the tick of its second waits for that (Windows.done).
            settled = await asyncio.gather(*settling, return_exceptions=True)
            self._windows.close(window)
        for outcome in settled:
            if isinstance(outcome, BaseException):
                raise outcome  # to Windows' on_failure: the worker stops

    async def _settle_sent(
        self, window: Window, sent: list[tuple[Callback, int]], deliveries: Deliveries
    ) -> None:
        """Once their delivery reports are in, record a window's sent timers and delete them.

        A failure stops the worker at once (:meth:`_fatal`), before the window sends on.
        """
        partition = window.partition
        try:
            await self._writer.delivered(deliveries)
            async with self._lock:
                if window.revoked or not self._owns(partition):
                    return  # the new owner re-sends them: at least once
                outcome = self.dispatch.settle([c for c, _ in sent], deliveries, [f for _, f in sent])
                await self.dispatch.deliver_dead_letters(outcome)
                part = _Changes()
                for i in outcome.done:
                    key = sent[i][0].key
                    if key not in window.removed:
                        part.records.append((key, None))
                        part.pending_delta -= 1
                # Transient failures stay in the table: the next tick's scan retries them.
                await self._commit({partition: part})
        except Exception as exc:
            self._fatal(exc)
            raise

    # -- table writes ----------------------------------------------------------

    async def _commit(self, changes: dict[int, _Changes]) -> None:
        """Write changelog records, wait for them, then apply them to the local tables.

        Every write ends with the partition's progress record (watermark and last
        applied request offset), which acknowledges the requests it covers: a restart
        skips them. So it goes out in a flush of its own, after everything the step
        caused — its changelog records, events and dead letters — was delivered. (On
        the embedded broker, a tail in a batch of its own also keeps Faust's table
        recovery exact: Tansu reports a partition's end as its last batch's first offset + 1.)
        """
        changes = {
            p: c
            for p, c in changes.items()
            if c.records or c.watermark is not None or c.request_offset is not None or c.topic_offsets
        }
        self.dispatch.produce_events()  # delivered with this write's records, checked below
        changelog = self.config.changelog_topic
        deliveries = Deliveries()
        staged: dict[int, list[Record]] = {}
        for partition, part in changes.items():
            # Other ingress topics' progress follows the records it covers.
            staged[partition] = [
                *part.records,
                *(topic_progress_record(*p) for p in part.topic_offsets.items()),
            ]
            self._writer.produce_many(changelog, partition, staged[partition], deliveries)
        side = self.dispatch.take_side()  # this step's events and dead letters
        await self._writer.delivered(deliveries, side)
        deliveries.raise_first("changelog")
        side.raise_first("event or dead-letter")
        # The tails come last in their partitions: their offsets are how far the changelog is written.
        deliveries = Deliveries(offsets=True)
        for partition, part in changes.items():
            table = self._tables(partition)
            tail = progress_record(
                table.watermark if part.watermark is None else part.watermark,
                table.request_offset if part.request_offset is None else part.request_offset,
            )
            staged[partition].append(tail)
            self._writer.produce(changelog, tail[0], tail[1], partition=partition, deliveries=deliveries)
        await self._writer.delivered(deliveries)
        deliveries.raise_first("changelog")
        for partition, records in staged.items():
            table = self._tables(partition)
            table.apply(
                records, deliveries.offsets.get(partition), pending_delta=changes[partition].pending_delta
            )
