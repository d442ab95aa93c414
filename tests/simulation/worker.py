"""One simulated worker process: the production engine, its RocksDB tables, and a consumer.

What the transport and the store do around the engine is played here through the engine's own
entry points: fetched requests go to :meth:`TimerEngine.ingest`, fetched ticks to
:meth:`TimerEngine.note_ticks` and :meth:`TimerEngine.wake`, with :meth:`TimerEngine.run` as
the firing task; a rebalance calls :meth:`TimerEngine.revoke` then awaits
:meth:`TimerEngine.settle_revoked`; an assignment does what :meth:`TimerStore.on_rebalance` does,
under the engine lock: deletes the tables of partitions assigned elsewhere, rebuilds a kept or
found table too old for :class:`TableReuse`, builds each partition's :class:`OwnerFence` and
awaits :meth:`TimerEngine.own` for the group's generation; then each assigned partition is
restored as Faust restores the store: the changelog from the table's ``persisted_offset`` on,
through the fence (:meth:`TimerStore.apply_changelog_batch`'s path: a table that diverged is
marked stale and the worker stops), every assigned table is marked current
(:meth:`TimerStore.on_recovery_completed`), and requests are read from just past the table's last
applied offset (:meth:`TimerStore.resume_positions`).

Modelled: the consumer's request frontier (the timestamp before which every request is applied,
:mod:`futures.worker.join`), read_committed fetches (:func:`futures.worker.faust_adapter.read_committed`),
group-committed tick offsets. Not modelled: Faust's own consumer (acks, commits of
request offsets: the worker resumes from its changelog), precise mode, extra ingress topics,
delivery failures, the admin API.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.fencing import OwnerFence, missed_a_generation
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.restate import replayed
from futures.worker.store import TableDiverged, _check
from futures.worker.table import PartitionTimers, Record, Unswept
from tests.simulation.kafka import LogRecord, SimKafka
from tests.simulation.loop import SimLoop
from tests.simulation.producer import ProducerHost, SimCrash, SimProducer
from tests.worker.fakes import FakeTopics

if TYPE_CHECKING:
    from tests.simulation.world import World

#: Virtual CPU time a table write takes per record, and the sweep's read per listed timer (s),
#: and the latter on a disk under load (sweep_handback: a sweep of thousands of timers
#: then lasts long enough for a tick to come while it reads).
WRITE_COST_S = 2e-6
SWEEP_READ_COST_S = 20e-6
SLOW_SWEEP_READ_COST_S = 400e-6
#: The consumer's isolation level: read_committed, which the worker sets on Faust's aiokafka
#: consumer (:func:`futures.worker.faust_adapter.read_committed`). Mirror the app's setting.
READ_COMMITTED = True
#: How often the consumer fetches (ms) and how many request records an ingest step takes at most.
FETCH_MS = 20
STEP_RECORDS = 200


class SimTable(PartitionTimers):
    """A partition table whose every write is a write boundary of its worker (a crash may come there)."""

    def __init__(self, path: Path, host: SimWorker) -> None:
        super().__init__(path)
        self._host = host

    def apply(self, records: Sequence[Record], offset: int | None, *args: Any, **kwargs: Any) -> None:
        self._host.write()
        self._host.loop.charge(len(records) * WRITE_COST_S)
        super().apply(records, offset, *args, **kwargs)

    def unswept(self, listed: list[bytes], fired_key: bytes) -> Unswept:
        self._host.loop.charge(len(listed) * self._host.sweep_read_cost_s)
        return super().unswept(listed, fired_key)

    def progress_landed(self, record: Record, offset: int | None, landed_ms: int) -> None:
        self._host.write()
        super().progress_landed(record, offset, landed_ms)


class SimGaps:
    """The gap reader: a range of a request partition read back (read_committed: librdkafka's default)."""

    def __init__(self, kafka: SimKafka) -> None:
        self._kafka = kafka

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        found, _ = self._kafka.read(topic, partition, start, end - start, committed=True)
        return [_source(topic, partition, r) for r in found if r.offset < end]


def _source(topic: str, partition: int, record: LogRecord) -> SourceRecord:
    return SourceRecord(
        topic, partition, record.offset, record.key, record.value, record.headers, record.timestamp_ms
    )


class SimWorker(ProducerHost):
    """A worker process: alive between :meth:`start` and :meth:`crash`; its data dir outlives it."""

    def __init__(self, index: int, directory: Path, world: World, skew_ms: int) -> None:
        self.index = index
        self.name = f"w{index}"
        self.directory = directory
        self.world = world
        self.skew_ms = skew_ms
        self.dead = True
        #: Which life of the worker this is (a restart starts a new engine).
        self.life = 0
        self.writes = 0
        self.crash_at: int | None = None
        self.crash_share = 0.0
        self.slow_ms = 0
        self.slow_until_ms = 0
        #: Stalled until then (its loop does not run); then it hears of a rebalance at hears_at_ms.
        self.paused_until_ms = 0
        self.hears_at_ms: int | None = None
        #: Its session expired while it stalled: the group left it out (until it hears and rejoins).
        self.evicted = False
        self.rng = random.Random(index)
        self.failure: BaseException | None = None
        #: What the sweep's read costs per listed timer (s): SWEEP_READ_COST_S, or SLOW_SWEEP_READ_COST_S.
        self.sweep_read_cost_s = SWEEP_READ_COST_S
        #: The engine's metrics, kept across lives: what a run counts.
        self.metrics = WorkerMetrics()

    # -- ProducerHost ----------------------------------------------------------

    def write(self) -> None:
        if self.dead:
            raise SimCrash(self.name)
        self.writes += 1
        if self.crash_at is not None and self.writes >= self.crash_at:
            self.crash(self.crash_share)
            raise SimCrash(self.name)

    def now_ms(self) -> int:
        """The true time as this worker lives it: the world's, or ahead by the CPU time it spent."""
        return max(self.world.now_ms, self.world.epoch_ms + round(self.loop.now_s * 1000))

    def clock_ms(self) -> int:
        return self.now_ms() + self.skew_ms

    def latency_ms(self) -> int:
        base = self.rng.randint(1, 8)
        return base + (self.slow_ms if self.world.now_ms < self.slow_until_ms else 0)

    # -- life --------------------------------------------------------------------

    def start(self, empty_dir: bool) -> None:
        if empty_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.dead = False
        self.life += 1
        self.crash_at = None
        self.paused_until_ms, self.hears_at_ms, self.evicted = 0, None, False
        self.failure = None
        world = self.world
        self.loop = SimLoop(world.loop_s())
        self.producer = SimProducer(world.kafka, self)
        self.quiet = SimProducer(world.kafka, self)
        self.tables: dict[int, SimTable] = {}
        self.owned: set[int] = set()
        #: This life's last assignment (as TimerStore keeps it: the tables kept open since).
        self.assigned: set[int] = set()
        self.restoring: set[int] = set()
        self.positions: dict[int, int] = {}
        self._frontier: dict[int, int] = {}
        config: WorkerConfig = world.config
        self.engine = TimerEngine(
            config,
            self.table,
            KafkaWriter(self.producer, config.max_record_bytes, quiet=self.quiet),
            self.metrics,
            clock=self.clock_ms,
            owns=lambda partition: partition in self.owned,
            callback_topics=FakeTopics(),
            frontier=self,
            gaps=SimGaps(world.kafka),
        )
        # The one seam: the join's bound on a tick's wait reads a monotonic clock given to
        # WaitingTicks, which the engine does not pass on; here it is the loop's virtual one.
        waiting = self.engine._waiting  # noqa: SLF001
        assert hasattr(waiting, "_monotonic"), "WaitingTicks no longer keeps _monotonic: update the seam"
        waiting._monotonic = self.loop.time  # noqa: SLF001
        self.tasks = [self.loop.create_task(self.engine.run()), self.loop.create_task(self._consume())]
        #: The assignments made to this life, the last one under way or done.
        self.assigning: list[asyncio.Task[None]] = []

    def table(self, partition: int) -> SimTable:
        """The engine's ``tables``: opened on first use, as :meth:`TimerStore.partition` (a table
        marked stale is rebuilt; a new one is current)."""
        if self.dead:
            raise SimCrash(self.name)
        table = self.tables.get(partition)
        if table is None:
            path = self._path(partition)
            created = not path.exists()
            table = SimTable(path, self)
            if table.stale:
                table.destroy()
                table, created = SimTable(path, self), True
                self.world.history.injected["stale_table_rebuilt"] += 1
            if created:
                table.mark_current(self.clock_ms())
            self.tables[partition] = table
        return table

    def _path(self, partition: int) -> Path:
        return self.directory / f"partition-{partition}.db"

    def crash(self, delivered_share: float) -> None:
        """Die now: in-flight records partly delivered, the loop stopped where it is, tables closed
        (RocksDB keeps what was written to it)."""
        if self.dead:
            return
        self.dead = True
        self.world.history.crashes.append(self.world.now_ms)
        self.producer.crash(delivered_share)
        self.quiet.crash(delivered_share)
        self.owned = set()
        self.loop.stop()
        for table in self.tables.values():
            table.close()
        self.tables = {}

    def run_until(self, loop_s: float) -> None:
        if self.dead:
            return
        self.loop.run_until(loop_s)
        if self.dead:
            return  # crashed inside
        for task in [*self.tasks, *self.assigning[-1:]]:
            if task.done() and not task.cancelled():
                exc = task.exception()
                if isinstance(exc, TableDiverged):
                    # The worker stops on purpose: restarted, it rebuilds the table marked stale.
                    self.world.diverged(self)
                    self.crash(1.0)
                    return
                if exc is not None and not isinstance(exc, SimCrash):
                    # The process exits (main stops the worker on a failed engine task).
                    self.failure = exc
                    self.world.stopped(self, exc)
                    self.crash(1.0)
                    return

    def arrive(self) -> None:
        if not self.dead:
            self.producer.arrive()
            self.quiet.arrive()

    # -- rebalance -----------------------------------------------------------------

    def revoke(self, partitions: set[int]) -> asyncio.Task[None]:
        """As the store's ``revoke`` and ``settle_revoked`` (Faust's on_partitions_revoked)."""
        self.owned -= partitions
        self.engine.revoke(partitions)
        return self.loop.create_task(self._settle(partitions))

    async def _settle(self, partitions: set[int]) -> None:
        started = self.loop.time()
        await self.engine.settle_revoked()
        # settle_revoked gives up at its bound, leaving the step under way to the new owner.
        gave_up = self.loop.time() - started >= self.world.settle_s - 1e-3
        self.world.settled(self, partitions, gave_up)

    def assign(self, assigned: set[int], generation: int, batch: Callable[[], int]) -> asyncio.Task[None]:
        """The group's assignment of ``generation``: ``assigned`` is all this worker holds now.
        Faust's recovery then reads every one of them from its table's persisted offset (a kept
        table's live writes again, a rebuilt table's whole log), and the consumer seeks each to
        the table's resume position."""
        task = self.loop.create_task(self._assign(assigned, generation, batch))
        self.assigning.append(task)
        return task

    async def _assign(self, assigned: set[int], generation: int, batch: Callable[[], int]) -> None:
        world = self.world
        fences: dict[int, OwnerFence] = {}
        async with self.engine._ctx.lock:  # noqa: SLF001
            # As TimerStore.on_rebalance: what went elsewhere is deleted, found tables too.
            for partition in set(self.tables) - assigned:
                self.tables.pop(partition).destroy()
            for path in self.directory.glob("partition-*.db"):
                if int(path.name[len("partition-") : -len(".db")]) not in assigned:
                    shutil.rmtree(path, ignore_errors=True)
            kept, self.assigned = self.assigned & assigned, set(assigned)
            now = self.clock_ms()
            for partition in sorted(assigned):
                table = self.table(partition)
                if partition in kept and missed_a_generation(table.written_epoch, generation):
                    world.history.injected["table_rebuilt_missed_generation"] += 1
                elif not world.reuse.reusable(table.current_ms, now):
                    world.history.injected["table_rebuilt_too_old"] += 1
                else:
                    continue
                table.destroy()
                del self.tables[partition]
                self.table(partition)
            for partition in assigned:
                table = self.table(partition)
                fences[partition] = OwnerFence(table.owner_epoch, table.written_epoch)
            if assigned:
                await self.engine.own(set(assigned), generation)
        # Faust's recovery: each partition's changelog from the table's persisted offset to its end.
        kafka, topic = world.kafka, world.config.changelog_topic
        for partition in sorted(assigned):
            table = self.table(partition)
            fence = fences[partition]
            start = 0 if table.persisted_offset is None else table.persisted_offset + 1
            end = kafka.end_offset(topic, partition, committed=False)
            while start < end:
                found, start = kafka.read(topic, partition, start, batch(), committed=False)
                if not found:
                    continue
                records: list[Record] = [
                    (r.key, r.value)
                    for r in found
                    if r.key is not None and replayed(fence, table, r.key, r.headers)
                ]
                table.apply(records, found[-1].offset, owner_epoch=fence.epoch)
                world.history.injected["fenced_records"] += fence.fenced
                _check(fence, table, partition, found[-1].offset)
        now = self.clock_ms()
        for partition in assigned:
            self.table(partition).mark_current(now)  # read to the changelog's end
        for partition in sorted(assigned):
            table = self.table(partition)
            self.owned.add(partition)
            self.positions[partition] = table.request_offset + 1
            # Nothing fetched yet: no tick may pass until the first fetch says what is unread
            # (the transport's frontier is -1 then), or a request read again after a step cut
            # short would lose to a tick.
            self._frontier[partition] = -1
        self.engine.wake()

    # -- the consumer ---------------------------------------------------------------

    def frontier_ms(self, partition: int) -> int | None:
        """The request frontier of ``partition``: the oldest request fetched and not applied, else
        the time of the fetch that found none; -1 until the first fetch."""
        return self._frontier.get(partition)

    async def _consume(self) -> None:
        world = self.world
        topics = world.config.common.topics
        while True:
            for partition in sorted(self.owned):
                position = self.positions[partition]
                found, after = world.kafka.read(
                    topics.request, partition, position, STEP_RECORDS, committed=READ_COMMITTED
                )
                if found:
                    self._frontier[partition] = found[0].timestamp_ms
                    await self.engine.ingest([_source(topics.request, partition, r) for r in found])
                    if partition in self.owned:
                        self.positions[partition] = after
                    self.engine.wake()
                elif partition in self.owned:
                    self.positions[partition] = after
                    self._frontier[partition] = world.now_ms  # the fetch that found nothing more
            ticks: list[SourceRecord] = []
            for partition in sorted(self.owned):
                start = world.tick_positions.get(partition, 0)
                found, after = world.kafka.read(topics.oscillator, partition, start, 1_000, committed=False)
                ticks.extend(_source(topics.oscillator, partition, r) for r in found)
                world.tick_positions[partition] = after
            if ticks:
                self.engine.note_ticks(ticks)
                self.engine.wake()
            await asyncio.sleep(FETCH_MS / 1000)
