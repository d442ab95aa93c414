"""The worker's core: request → table → tick → dispatch, one module per job.

* **request → table** — :mod:`futures.worker.ingest` applies a step of request
  records to the partition tables (schedule, replace, cancel, dead letter);
* **tick** — :meth:`TimerEngine.note_ticks` takes the oscillator's ticks; a tick
  waits for the requests of its partition written before it
  (:mod:`futures.worker.join`), then :meth:`TimerEngine.fire_ready` moves the
  partition's watermark;
* **dispatch** — :mod:`futures.worker.firing` is the one fire path (build → send →
  confirm → settle), for a tick's second and for timers accepted already due;
  precise mode's per-millisecond windows (:mod:`futures.worker.precise`) send through
  the same pieces; callbacks are built ahead of their tick by :mod:`futures.worker.lookahead`;
* **durable** — every change of the tables goes through one changelog write,
  :func:`futures.worker.changelog.commit`, which orders the durable writes; fired
  timers' own tombstones follow when no tick waits (:mod:`futures.worker.sweep`).

Ingest and firing run one at a time under one lock (:attr:`EngineContext.lock`):
the tables change in the order the changelog records them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Sequence

from futures.ingress.records import SourceRecord
from futures.worker.changelog import open_epoch
from futures.worker.config import WorkerConfig
from futures.worker.context import EngineContext, wall_clock_ms
from futures.worker.destinations import AnyTopic, TopicDirectory
from futures.worker.dispatch import Dispatcher
from futures.worker.firing import Firing
from futures.worker.gaps import GapReader, ReadPast
from futures.worker.ingest import Ingest
from futures.worker.join import NoBacklog, RequestFrontier, WaitingTicks
from futures.worker.kafka import KafkaWriter
from futures.worker.lookahead import Lookahead
from futures.worker.metrics import WorkerMetrics
from futures.worker.precise import PreciseMode
from futures.worker.status import WorkerStatus
from futures.worker.sweep import Sweep
from futures.worker.table import PartitionTimers
from ktimers.deadletter import short
from ktimers.logs import ThrottledLog
from ktimers.wire import decode_tick

log = logging.getLogger(__name__)

#: Second mode: how long the first ticks of a second wait for the same second's ticks of this
#: worker's other partitions, which a fetch may not have brought with them (seconds).
TICK_GATHER_S = 0.025
#: Second mode: how long a second's ticks wait for one of them that requests written just
#: before it hold back (the next ingest step applies them; seconds).
JOIN_GATHER_S = 0.1

__all__ = ["TimerEngine", "wall_clock_ms"]


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
        read_past: ReadPast | None = None,
        callback_topics: TopicDirectory | None = None,
        frontier: RequestFrontier | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.status = status or WorkerStatus()  # what the admin API shows
        self.dispatch = Dispatcher(
            config.common.topics,
            writer,
            metrics,
            self.status,
            clock,
            callback_topics or AnyTopic(),
            stored=lambda callback: tables(callback.partition).get_raw(callback.key),
        )
        self._ctx = EngineContext(
            config, tables, writer, self.dispatch, metrics, clock, lock or asyncio.Lock(), owns, gaps
        )
        frontier = frontier or NoBacklog()
        #: Told of a failure that must stop the worker (durable writes failed): see _fatal.
        self.on_fatal = on_fatal
        self._failure: BaseException | None = None
        self._lookahead = Lookahead(self._ctx)  # second mode
        self._precise = PreciseMode(self._ctx, frontier, self._fatal) if config.precise else None
        self._firing = Firing(self._ctx, self._lookahead)
        self._sweep = Sweep(self._ctx)
        self._ingest = Ingest(
            self._ctx, self._firing.fire, self._precise.windows if self._precise else None, gaps, read_past
        )
        # Ticks not fired yet: waiting for the engine, or for older requests (futures/worker/join.py).
        self._waiting = WaitingTicks(
            frontier,
            config.join_max_wait_s,
            on_waited=metrics.join_wait.observe,
            on_bound=metrics.join_wait_bound.inc,
        )
        self._woken = asyncio.Event()
        #: Second mode: partition → the second its watermark last moved to (the ticks a second
        #: expects).
        self._watermarks: dict[int, int] = {}
        self._ticks_log = ThrottledLog(log)

    # -- request → table -------------------------------------------------------

    async def ingest(self, records: Sequence[SourceRecord]) -> None:
        """Apply a step of request records of any ingress topic; durable when this returns, but
        for the progress records that acknowledge them (:meth:`landed`)."""
        await self._ingest.accept(records)

    # -- tick ------------------------------------------------------------------

    def note_ticks(self, ticks: Sequence[SourceRecord]) -> None:
        """Take a batch of ticks: each partition's watermark is to move to its highest second.

        Several oscillators tick every partition every second; a tick at or below the
        clock, or a copy of one waiting, moves nothing. One more than ``TIMERS_CLOCK_TOLERANCE_MS``
        ahead of this worker's clock is refused. The clock moves when :meth:`fire_ready` runs,
        as far as the partition's requests and this worker's clock allow.
        """
        duplicates = 0
        ctx = self._ctx
        for record in self._ingest.owned(ticks):
            second, source = decode_tick(record.key, record.value)
            if second is None:
                self.metrics.ticks.labels("invalid").inc()
                self._ticks_log.warning(
                    "ignoring tick %s with key %s: not an epoch second",
                    record.where(),
                    short(repr(record.key), 80),
                )
                continue
            now, tolerance = ctx.clock(), ctx.config.clock_tolerance_ms
            if second * 1000 - now > tolerance:
                # Refused here, not capped later: a tick kept waiting would hold back the real
                # ticks behind it, and the join's bound would fire it without its requests.
                self.metrics.ticks.labels("ahead").inc()
                self._ticks_log.warning(
                    "refusing tick %s for second %d from %s: %d ms ahead of this worker's clock "
                    "(TIMERS_CLOCK_TOLERANCE_MS=%d). Check the oscillator host's clock, and that "
                    "only the oscillators may write to the oscillator topic.",
                    record.where(), second, short(repr(source), 80), second * 1000 - now, tolerance,
                )  # fmt: skip
                continue
            partition = record.partition
            self.status.tick(partition, second, source)
            if not self._waiting.note(partition, second, ctx.tables(partition).watermark):
                duplicates += 1
        self.metrics.ticks.labels("duplicate").inc(duplicates)

    async def landed(self) -> None:
        """Wait until the progress records of every write so far have landed (the firing task
        does not: the next write to their partitions does, :mod:`futures.worker.progress`)."""
        await self._ctx.progress.landed()

    def wake(self) -> None:
        """Ticks came, or requests were applied: :meth:`run` looks at what may fire now."""
        self._woken.set()

    def frontier_moved(self) -> None:
        """A fetch response came, so the requests' frontier may have moved: :meth:`run` looks
        again if a tick waits (not otherwise: responses come many times a second)."""
        if self._waiting:
            self._woken.set()

    async def run(self, poll_s: float = 0.5) -> None:
        """The firing task: a :meth:`turn` whenever woken, and every ``poll_s`` seconds (a tick
        that waits for requests fires at the latest once TIMERS_JOIN_MAX_WAIT_S is up; one ahead
        of this worker's clock, once the clock reaches it). A progress record that failed to land
        raises here, if no step met it first."""
        while True:
            try:
                await asyncio.wait_for(self._woken.wait(), self._next_wake_s(poll_s))
            except TimeoutError:
                pass
            self._woken.clear()
            if await self.turn():
                self._woken.set()  # more to sweep: after what woke the engine meanwhile

    async def turn(self) -> bool:
        """One turn of the firing task: fire what the waiting ticks allow (in second mode, once a
        second's ticks are gathered), then, if no tick waits, one step of the sweep. Whether more
        is left to sweep."""
        self._ctx.progress.take_landed()
        await self._gather()
        await self.fire_ready()
        return not self._waiting and await self._sweep.step(give_way=self._ticks_wait)

    def _ticks_wait(self) -> bool:
        return bool(self._waiting)

    @property
    def idle(self) -> bool:
        """No engine step under way and no tick waiting: a moment for housekeeping."""
        return not self._waiting and not self._ctx.lock.locked()

    async def _gather(self) -> None:
        """Second mode: before a second's ticks fire, wait briefly for those of the same second
        that cannot fire with them yet, so that all go out as one stream in due order.

        A firing holds the engine lock for as long as the second's timers take to go out
        (docs/PERFORMANCE.md#sustaining-a-rate), and a partition left out of it waits for
        all of it: its most overdue timers then leave last. Two things leave one out:

        * **its tick has not come** (the oscillator ticks every partition at once, but a fetch
          may bring some of them and the next fetch the rest): waited for at most
          TICK_GATHER_S, and only for a partition whose watermark is one second behind (not one
          catching up, nor more than once for one whose ticks stopped);
        * **its tick came, but requests written just before it are not applied yet**
          (:meth:`WaitingTicks.held`): the fetcher's next ingest step applies them, which the
          firing would make wait (the step needs the lock). Waited for at most JOIN_GATHER_S,
          and only for a partition whose frontier is within the second before the tick (not
          one behind by a backlog).
        """
        if self._precise is not None:
            return
        start = asyncio.get_running_loop().time()
        while True:
            waiting = self._waiting.seconds()
            if not waiting:
                return
            second = max(waiting.values())
            owns = self._ctx.owns
            held = any(
                waiting[partition] == second and frontier_ms >= (second - 1) * 1000 and owns(partition)
                for partition, frontier_ms in self._waiting.held().items()
            )
            if held:
                bound_s = JOIN_GATHER_S
            elif any(
                watermark == second - 1 and partition not in waiting and owns(partition)
                for partition, watermark in self._watermarks.items()
            ):
                bound_s = TICK_GATHER_S
            else:
                return
            left = start + bound_s - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._woken.clear()
            try:
                await asyncio.wait_for(self._woken.wait(), left)
            except TimeoutError:
                return

    async def fire_ready(self) -> None:
        """Move the watermarks the waiting ticks allow, firing what comes due."""
        precise = self._precise
        while self._waiting:
            if precise is not None:
                # A precise window ends at its tick's very second: let it finish sending and
                # deleting, so the tick's scan does not find its timers.
                await precise.windows.done(self._waiting.seconds())
            async with self._ctx.lock:
                if precise is not None and precise.windows.sending(self._waiting.seconds()):
                    continue  # a later tick came while this one waited for the lock: its windows too
                targets = self._claim_ticks()
                if not targets:
                    return
                self._sweep.note(targets)
                join = None if precise is not None else self._join
                moved = await self._firing.fire(targets, join)
                if precise is not None:
                    for partition, second in moved.items():
                        await precise.open(partition, second)
                else:
                    self._lookahead.moved(moved)
                    self._watermarks.update(moved)
            self.metrics.ticks.labels("advanced").inc(len(moved))
            return

    def _join(self, firing: Collection[int]) -> dict[int, int]:
        """Second mode: the watermark moves of partitions other than ``firing`` that may join a firing
        under way (one second's ticks of several partitions often come in two fetches)."""
        waiting = [p for p in self._waiting.seconds() if p not in firing]
        return self._claim_ticks(waiting) if waiting else {}

    def _claim_ticks(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Partition → the second its watermark moves to now (of ``partitions``, or all with waiting
        ticks)."""
        owns = self._ctx.owns
        # Revoked by a rebalance while the tick waited: the new owner has ticks of its own.
        self._waiting.drop([p for p in self._waiting.seconds() if not owns(p)])
        # Never past this worker's own clock: a tick that leads it (by up to the tolerance
        # note_ticks admits) waits for it, so no timer fires before its due time here.
        claimed = self._waiting.claim(self._ctx.clock() // 1000, partitions)
        tables = self._ctx.tables
        # A watermark inherited from a previous owner may be ahead of the tick: nothing to move.
        return {
            partition: second for partition, second in claimed.items() if second > tables(partition).watermark
        }

    def _next_wake_s(self, poll_s: float) -> float:
        """How long :meth:`run` may sleep (seconds): ``poll_s``, or less when a waiting tick's
        second comes sooner by this worker's clock."""
        now = self._ctx.clock()
        ahead_ms = [second * 1000 - now for second in self._waiting.seconds().values() if second * 1000 > now]
        return min(poll_s, *(ms / 1000 for ms in ahead_ms)) if ahead_ms else poll_s

    # -- assignment, revocation and failure ---------------------------------------

    async def own(self, partitions: Iterable[int], epoch: int) -> None:
        """``partitions`` are assigned to this worker in consumer group generation ``epoch``: write
        their owner records, so that what an earlier owner writes from now on is fenced
        (:mod:`futures.worker.fencing`). Under the engine lock, before their recovery."""
        await open_epoch(self._ctx, partitions, epoch)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Stop at once what this worker would still send of ``partitions``, revoked by a rebalance.

        Call it as the revocation is reported, before the group rejoins (so before a new
        owner fires them), with ``owns`` saying False for them from then on. A firing under
        way sends nothing more of them; their precise windows send nothing more. What was
        sent is settled by :meth:`settle_revoked`; what was not stays in the table, for the
        new owner. The callbacks built ahead for them are dropped, and where their sweep stopped
        is forgotten (another owner may write under the same ``f`` keys meanwhile).
        """
        revoked = set(partitions)
        for partition in revoked:
            self._watermarks.pop(partition, None)
        self._sweep.revoke(revoked)
        if self._precise is not None:
            self._precise.windows.revoke(revoked)
        for partition in revoked:
            self._lookahead.drop(partition)

    async def settle_revoked(self) -> None:
        """Settle what this worker sent of the partitions :meth:`revoke` took away: their precise
        windows' sent timers, and the step under way (a firing's pieces in flight, an ingest
        step) written to the changelog, its progress records landed. Await it before the group
        rejoins: the new owner then rebuilds a table that no longer holds what was sent here, so a
        rebalance sends nothing twice. At most a third of the rebalance timeout, so the group
        keeps this member; what is not settled by then stays in the table, for the new owner to
        send again (at least once).
        """
        timeout_s = self.config.group_timeouts[2] / 3
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._precise is not None and not await self._precise.windows.settle_revoked(timeout_s):
            log.warning("revoked precise windows did not settle within %.1fs: the new owner may send again "
                        "what they sent", timeout_s)  # fmt: skip
        try:
            async with asyncio.timeout_at(deadline), self._ctx.lock:
                await self._ctx.progress.landed()
        except TimeoutError:
            log.warning("the engine step under way did not end within %.1fs of the revocation", timeout_s)

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
        self._ctx.owns = lambda partition: False
        windows = self._precise.windows.partitions() if self._precise is not None else set()
        self.revoke([*windows, *self._lookahead.partitions()])
        if self._precise is not None:
            self._precise.windows.abandon()  # no window writes on: the restarted worker sends theirs
        if self.on_fatal is not None:
            self.on_fatal(exc)
