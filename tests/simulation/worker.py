"""One simulated worker process: the production engine, its RocksDB tables, and a consumer.

What the transport and the store do around the engine is played here through the engine's own
entry points: fetched requests go to :meth:`TimerEngine.ingest`, fetched ticks to
:meth:`TimerEngine.note_ticks` and :meth:`TimerEngine.wake`, with :meth:`TimerEngine.run` as
the firing task; a rebalance calls :meth:`TimerEngine.revoke` then awaits
:meth:`TimerEngine.settle_revoked`; an assigned partition is restored as Faust restores the
store: the changelog from the table's ``persisted_offset`` on, through
:meth:`PartitionTimers.apply` (:meth:`TimerStore.apply_changelog_batch`'s path), and requests
are read from just past the table's last applied offset (:meth:`TimerStore.resume_positions`).

Modelled: the consumer's request frontier (the timestamp before which every request is applied,
:mod:`futures.worker.join`), read_uncommitted fetches (aiokafka's default, which the worker
keeps), group-committed tick offsets. Not modelled: Faust's own consumer (acks, commits of
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
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.table import PartitionTimers, Record, Unswept
from tests.simulation.kafka import LogRecord, SimKafka
from tests.simulation.loop import SimLoop
from tests.simulation.producer import ProducerHost, SimCrash, SimProducer
from tests.worker.fakes import FakeTopics

if TYPE_CHECKING:
    from tests.simulation.world import World

#: Virtual CPU time a table write takes per record, and the sweep's read per listed timer (s),
#: and the latter on a disk under load (known hole 2's fault: a sweep of thousands of timers
#: then lasts long enough for a tick to come while it reads).
WRITE_COST_S = 2e-6
SWEEP_READ_COST_S = 20e-6
SLOW_SWEEP_READ_COST_S = 400e-6
#: The consumer's isolation level: aiokafka's default, read_uncommitted, which the worker's
#: Faust consumer keeps (aborted transactions' records are fetched too). Mirror the app's setting.
READ_COMMITTED = False
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

    def progress_landed(self, record: Record, offset: int | None) -> None:
        self._host.write()
        super().progress_landed(record, offset)


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
        self.restoring: set[int] = set()
        self.positions: dict[int, int] = {}
        self._frontier: dict[int, int] = {}
        config: WorkerConfig = world.config
        self.engine = TimerEngine(
            config,
            self.table,
            KafkaWriter(self.producer, config.max_record_bytes, quiet=self.quiet),
            WorkerMetrics(),
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

    def table(self, partition: int) -> SimTable:
        """The engine's ``tables``: opened on first use, as :meth:`TimerStore.partition`."""
        if self.dead:
            raise SimCrash(self.name)
        table = self.tables.get(partition)
        if table is None:
            table = self.tables[partition] = SimTable(self.directory / f"partition-{partition}.db", self)
        return table

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
        for task in self.tasks:
            if task.done() and not task.cancelled():
                exc = task.exception()
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

    def release(self, partitions: set[int]) -> None:
        """The assignment gave ``partitions`` to others: their tables close, as the store's
        ``on_rebalance`` closes them, under the engine lock (a step still under way finishes
        first: its late writes, known hole 5, land after the new owner restored)."""

        async def close() -> None:
            async with self.engine._ctx.lock:  # noqa: SLF001
                for partition in partitions:
                    if partition not in self.owned and partition in self.tables:
                        self.tables.pop(partition).close()

        if not self.dead and partitions:
            self.loop.create_task(close())

    def assign(
        self, partitions: set[int], batch: Callable[[], int], keep_dir: Callable[[int, int | None], bool]
    ) -> None:
        """Restore ``partitions`` from the changelog (into the table left in the data dir, if
        ``keep_dir`` says so, else into an empty one) and read their requests from there."""
        try:
            self._assign(partitions, batch, keep_dir)
        except SimCrash:
            return  # died restoring (a crash armed on a write)
        self.engine.wake()

    def _assign(
        self, partitions: set[int], batch: Callable[[], int], keep_dir: Callable[[int, int | None], bool]
    ) -> None:
        kafka, topic = self.world.kafka, self.world.config.changelog_topic
        for partition in sorted(partitions):
            if self.dead:
                raise SimCrash(self.name)
            path = self.directory / f"partition-{partition}.db"
            table = self.tables.get(partition)
            if table is None:
                # Handed back while its table is open (an eager rebalance), the store keeps it open.
                if path.exists():
                    probe = PartitionTimers(path)
                    persisted = probe.persisted_offset
                    probe.close()
                    if not keep_dir(partition, persisted):
                        shutil.rmtree(path)
                table = self.tables[partition] = SimTable(path, self)
            start = 0 if table.persisted_offset is None else table.persisted_offset + 1
            end = kafka.end_offset(topic, partition, committed=False)
            while start < end:
                found, start = kafka.read(topic, partition, start, batch(), committed=False)
                records: list[Record] = [(r.key, r.value) for r in found if r.key is not None]
                if records:
                    table.apply(records, found[-1].offset)
            self.owned.add(partition)
            self.positions[partition] = table.request_offset + 1
            # Nothing fetched yet: no tick may pass until the first fetch says what is unread
            # (the transport's frontier is -1 then), or a request read again after a step cut
            # short would lose to a tick.
            self._frontier[partition] = -1

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
