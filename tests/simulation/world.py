"""The world: a simulated Kafka, clients, oscillators and workers, run through a schedule.

Time is the world's (:attr:`World.now_ms`, epoch ms, the true time); each worker and oscillator
reads it through its own skewed clock. An :class:`~tests.simulation.schedule.Advance` moves time
in small slices: oscillators tick each second their clock reaches, records in flight land, and
every live worker's loop runs up to the slice's end, in a drawn order. A crashed worker's
partitions wait for the session timeout, then go to the live workers, as the group would.

The run ends by healing the world (no more faults, every worker back, one last rebalance, time
enough for every timer to come due and the join's bound to pass); the checker then reads what
came out (:mod:`tests.simulation.checker`).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from futures.worker.changelog_topic import TableReuse
from futures.worker.config import WorkerConfig
from futures.worker.fencing import OwnerFence
from futures.worker.table import PartitionTimers
from ktimers.config import BrokerProfile, CommonConfig, KafkaConfig
from ktimers.wire import Cancel as CancelMsg
from ktimers.wire import Future, Tick, encode_second_key
from tests.simulation import schedule as S
from tests.simulation.faults import Fault
from tests.simulation.kafka import LogRecord, Partition, SimKafka, TxnState
from tests.simulation.model import Model, Write
from tests.simulation.worker import SLOW_SWEEP_READ_COST_S, SimWorker

#: Where the world's clock starts (epoch ms).
EPOCH_MS = 1_795_000_000_000
#: The callback topic every timer names.
CALLBACKS = "orders"
#: delete.retention.ms of the compacted changelog when tombstones expire (ms, simulated).
DELETE_RETENTION_MS = 5_000
#: The changelog's ``min.compaction.lag.ms``: its owner restates a key a fenced owner wrote within
#: seconds while ticks flow (futures/worker/restate.py); the lag keeps the record it restates.
MIN_COMPACTION_LAG_MS = 60_000
#: A unknown group field (field 15: start 0x7b, end 0x7c) appended to a valid Future.
MALFORMED_TAIL = b"\x7b\x7c"


@dataclass
class Oscillator:
    name: str
    skew_ms: int
    last_second: int
    paused_until_ms: int = 0


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


@dataclass
class History:
    """What happened that licenses a duplicate: crashes, handovers a revocation did not settle."""

    crashes: list[int] = field(default_factory=list)  # true ms
    unsettled: list[tuple[int, int]] = field(default_factory=list)  # (true ms, partition)
    #: An owner stalled past its session: (worker, stalled at, heard at, partition), true ms.
    paused: list[tuple[str, int, int, int]] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)


def _first_young_fenced(part: Partition, now_ms: int) -> int:
    """The offset of the first record written by an owner after a newer one started, within the
    changelog's ``min.compaction.lag.ms`` of now (the log's end if none). Kafka compacts nothing
    younger than the lag; compaction here stops short of such a record only, and cleans whatever
    else it is told to: more than Kafka ever would, never less."""
    fence = OwnerFence()
    for record in part.records:
        if record.key is not None and not fence.admit(record.key, record.headers):
            if now_ms - record.timestamp_ms < MIN_COMPACTION_LAG_MS:
                return record.offset
    return part.next_offset


def _config() -> WorkerConfig:
    return WorkerConfig(common=CommonConfig(kafka=KafkaConfig(profile=BrokerProfile.CLUSTER)))


class World:
    def __init__(self, directory: Path, faults: frozenset[Fault], seed: int) -> None:
        self.directory = directory
        self.faults = faults
        self.config = _config()
        self.topics = self.config.common.topics
        self.kafka = SimKafka()
        for topic in (self.topics.request, self.topics.oscillator, self.config.changelog_topic):
            self.kafka.create(topic, S.PARTITIONS)
        self.kafka.create(CALLBACKS, 1)
        self.model = Model()
        self.history = History()
        self.violations: list[Violation] = []
        self.epoch_ms = EPOCH_MS
        self.now_ms = EPOCH_MS
        rng = random.Random(seed)
        tolerance = self.config.clock_tolerance_ms
        skewed = Fault.CLOCK_SKEW in faults

        def skew(bound: int) -> int:
            return rng.randint(-bound, bound) if skewed else 0

        self.oscillators = [
            Oscillator(f"osc-{n}", skew(tolerance // 3), (EPOCH_MS + 0) // 1000) for n in range(S.OSCILLATORS)
        ]
        self.workers = [
            SimWorker(n, directory / f"w{n}", self, skew(tolerance * 4 // 5)) for n in range(S.WORKERS)
        ]
        if Fault.SWEEP_HANDBACK in faults:
            for worker in self.workers:
                worker.sweep_read_cost_s = SLOW_SWEEP_READ_COST_S
        self.owner: dict[int, SimWorker | None] = dict.fromkeys(range(S.PARTITIONS))
        self.tick_positions: dict[int, int] = {}
        self.settle_s = self.config.group_timeouts[2] / 3
        retention = DELETE_RETENTION_MS if Fault.TOMBSTONE_EXPIRY in faults else 10**15
        #: What the store reuses a table by (the worker reads it from the changelog's settings).
        self.reuse = TableReuse.after(retention, "the simulated changelog's delete.retention.ms")
        #: The consumer group's generation: raised at every assignment the group makes.
        self.generation = 0
        #: Workers stopped by a restore that met their own fenced writes: restarted on their dir.
        self._diverged: list[SimWorker] = []
        self.session_ms = int(self.config.group_timeouts[0] * 1000)
        self._orphaned_at: int | None = None
        self._rejoin = False  # a worker the group went on without came back: rebalance after the step
        self._settled: set[tuple[int, int]] = set()
        self._rng = random.Random(seed ^ 0x5EED)
        self.steps = 0
        #: After healing: per partition, the timers its owner's table holds and its pending count.
        self.final_tables: dict[int, tuple[int, int]] = {}
        for worker in self.workers:
            worker.start(empty_dir=True)
        self._rebalance(tuple(range(S.PARTITIONS)))

    @staticmethod
    def settle_time_s() -> float:
        """How long a revocation waits for the engine's step under way (a third of the rebalance timeout)."""
        return _config().group_timeouts[2] / 3

    # -- time ------------------------------------------------------------------

    def loop_s(self) -> float:
        return (self.now_ms - EPOCH_MS) / 1000

    def _slice(self, to_ms: int) -> None:
        self.now_ms = to_ms
        self._oscillate()
        for worker in self.workers:
            worker.arrive()
        order = list(self.workers)
        self._rng.shuffle(order)
        for worker in order:
            if worker.paused_until_ms <= self.now_ms:
                worker.run_until(self.loop_s())
        self._zombies_hear()
        for worker in self.workers:
            worker.arrive()

    def _run(
        self, ms: int, quantum_ms: int, rng: random.Random, until: Callable[[], bool] = lambda: False
    ) -> None:
        end = self.now_ms + ms
        while self.now_ms < end and not until():
            self._slice(min(self.now_ms + rng.randint(1, quantum_ms), end))

    def _oscillate(self) -> None:
        for osc in self.oscillators:
            if self.now_ms < osc.paused_until_ms:
                continue
            reached = (self.now_ms + osc.skew_ms) // 1000
            for second in range(osc.last_second + 1, reached + 1):
                for partition in range(S.PARTITIONS):
                    self._tick(partition, second, osc.name)
            osc.last_second = max(osc.last_second, reached)

    def _tick(self, partition: int, second: int, source: str) -> None:
        value = Tick(second=second, source=source, emitted_ms=self.now_ms).SerializeToString()
        record = LogRecord(0, encode_second_key(second), value, (), self.now_ms, source, self.now_ms)
        self.kafka.append(self.topics.oscillator, partition, record)

    # -- steps -------------------------------------------------------------------

    def run(self, steps: list[S.Step]) -> None:
        for step in steps:
            self.step(step)
            self.steps += 1
        self.heal()

    def step(self, step: S.Step) -> None:
        if isinstance(step, S.Schedule):
            for n in range(step.count):
                timer = step.timer + n * step.stride
                self._write(
                    timer, step.version, step.due_in_ms + n * step.spread_ms, step.txn, step.malformed
                )
            if step.malformed:
                self.history.injected["malformed_request"] += 1
            if step.txn is not S.Txn.PLAIN:
                self.history.injected[f"{step.txn.value}_txn"] += 1
        elif isinstance(step, S.Cancel):
            self._write(step.timer, step.version, None, step.txn, False)
        elif isinstance(step, S.Advance):
            self._run(step.ms, step.quantum_ms, random.Random(step.seed))
        elif isinstance(step, S.TickFault):
            self._tick_fault(step)
        elif isinstance(step, S.PauseOscillator):
            osc = self.oscillators[step.oscillator % len(self.oscillators)]
            osc.paused_until_ms = self.now_ms + step.seconds * 1000
            self.history.injected["late_tick"] += 1
        elif isinstance(step, S.Crash):
            worker = self.workers[step.worker]
            if not worker.dead:
                worker.crash_share = step.delivered_share
                worker.crash_at = worker.writes + step.after_writes
                if step.after_writes == 0:
                    worker.crash(step.delivered_share)
                self.history.injected["crash"] += 1
        elif isinstance(step, S.Restart):
            worker = self.workers[step.worker]
            if worker.dead:
                self._note_dead()
                worker.start(empty_dir=step.empty_dir)
                self.history.injected["restart_empty" if step.empty_dir else "restart_old"] += 1
                self._rebalance(tuple(range(S.PARTITIONS)))
        elif isinstance(step, S.Rebalance):
            self.history.injected["rebalance"] += 1
            self._rebalance(step.owners, step.eager)
        elif isinstance(step, S.Compact):
            self._compact(step.partition, step.tail)
        elif isinstance(step, S.Slow):
            worker = self.workers[step.worker]
            worker.slow_ms, worker.slow_until_ms = step.latency_ms, self.now_ms + step.for_ms
            self.history.injected["slow_broker"] += 1
        elif isinstance(step, S.Pause):
            self._pause(step)
        elif isinstance(step, S.Verify):
            self.verify()
        self._note_dead()
        if self._rejoin or (
            self._orphaned_at is not None and self.now_ms - self._orphaned_at >= self.session_ms
        ):
            self._rejoin = False
            self._rebalance(tuple(range(S.PARTITIONS)))

    def _note_dead(self) -> None:
        """A worker that died since: its partitions are orphans until the session timeout."""
        for partition, owner in self.owner.items():
            if owner is not None and owner.dead:
                self.owner[partition] = None
                if self._orphaned_at is None:
                    self._orphaned_at = self.now_ms

    def _write(self, timer: int, version: int, due_in_ms: int | None, txn: S.Txn, malformed: bool) -> None:
        timer_id = f"t{timer}"
        partition = timer % S.PARTITIONS
        headers: tuple[tuple[str, bytes | None], ...] = ()
        due_ms = None if due_in_ms is None else self.now_ms + due_in_ms
        if due_ms is None:
            value = CancelMsg(id=timer_id).SerializeToString()
            headers = (("kt-kind", b"cancel"),)
        else:
            payload = f"{timer_id}|{version}".encode()
            future = Future(
                callBackTopic=CALLBACKS, callBackKey=timer_id, callBack=payload, id=timer_id, due_ms=due_ms
            )
            value = future.SerializeToString() + (MALFORMED_TAIL if malformed else b"")
        txn_id = None if txn is S.Txn.PLAIN else self.kafka.begin()
        record = LogRecord(0, None, value, headers, self.now_ms, "client", self.now_ms, txn_id)
        offset = self.kafka.append(self.topics.request, partition, record)
        if txn_id is not None:
            state = TxnState.ABORTED if txn is S.Txn.ABORT else TxnState.COMMITTED
            self.kafka.end(txn_id, state, [(self.topics.request, partition)], self.now_ms, "client")
        self.model.add(Write(timer_id, version, partition, offset, self.now_ms, due_ms, txn is S.Txn.ABORT))

    def _tick_fault(self, step: S.TickFault) -> None:
        second = self.now_ms // 1000
        if step.kind is Fault.DUPLICATE_TICK:
            second = max(osc.last_second for osc in self.oscillators)
        elif step.kind is Fault.REORDERED_TICK:
            second -= step.back_s
        elif step.kind is Fault.BOGUS_TICK:
            second += 3600
        self._tick(step.partition, second, "osc-faulty")
        self.history.injected[step.kind.value] += 1

    # -- a stalled owner ---------------------------------------------------------------

    def _pause(self, step: S.Pause) -> None:
        """The worker stalls; past the session timeout, the group goes on without it: its
        partitions go to the others, and it hears of that ``zombie_ms`` after it resumes."""
        worker = self.workers[step.worker]
        if worker.dead or worker.paused_until_ms > self.now_ms:
            return
        self.history.injected["paused_owner"] += 1
        worker.paused_until_ms = self.now_ms + step.ms
        if step.ms <= self.session_ms:
            return
        rng = random.Random(step.ms)
        self._run(self.session_ms, 20, rng)
        worker.evicted = True  # its session expired: the group goes on without it
        stalled_at_ms = self.now_ms - self.session_ms
        self._rebalance(tuple(range(S.PARTITIONS)))
        worker.hears_at_ms = worker.paused_until_ms + step.zombie_ms
        # Until it hears (or dies first), what it sends of them its successors may send too.
        for partition in sorted(worker.owned):
            self.history.paused.append((worker.name, stalled_at_ms, worker.hears_at_ms, partition))

    def _zombies_hear(self) -> None:
        """A worker that resumed after the group went on without it hears of it: it revokes what
        it thought it held, settles, and rejoins (the assignment that follows deletes the tables
        of what went elsewhere)."""
        for worker in self.workers:
            if worker.hears_at_ms is not None and self.now_ms >= worker.hears_at_ms:
                worker.hears_at_ms = None
                if worker.dead:
                    continue
                stale = {p for p in worker.owned if self.owner[p] is not worker}
                if stale:
                    worker.revoke(stale)
                # It hears at its own time, which runs ahead of the world's by the CPU time it
                # spent: what it sent before then, it sent as a stalled owner.
                heard_ms = worker.now_ms()
                self.history.paused = [
                    (name, stalled, max(heard, heard_ms) if name == worker.name else heard, partition)
                    for name, stalled, heard, partition in self.history.paused
                ]
                worker.evicted = False
                self._rejoin = True  # it joins the group again: a rebalance

    # -- rebalances ----------------------------------------------------------------

    def settled(self, worker: SimWorker, partitions: set[int], gave_up: bool) -> None:
        if not gave_up:
            self._settled.update((worker.index, partition) for partition in partitions)

    def _rebalance(self, owners: tuple[int, ...], eager: bool = True) -> None:
        """Partition p goes to the ``owners[p]``-th live worker: the old owner revokes and settles
        (for at most the settle time), then every member gets its assignment of a new generation
        (owner records written, what it did not hold restored). ``eager``: every owner revokes all
        it holds, and is handed back what it keeps (Faust's default protocol). A member whose
        restore met writes of its own a newer owner fenced stops; it is restarted on its data dir,
        and the group rebalances again."""
        self._assign_once(owners, eager)
        while self._diverged:
            for worker in self._diverged:
                worker.start(empty_dir=False)
            self._diverged = []
            self._assign_once(tuple(range(S.PARTITIONS)), True)

    def diverged(self, worker: SimWorker) -> None:
        self.history.injected["diverged_restart"] += 1
        self._diverged.append(worker)

    def _assign_once(self, owners: tuple[int, ...], eager: bool) -> None:
        self._orphaned_at = None
        # The group waits for a member stalled within its session to come back and rejoin; one
        # whose session expired is left out, and not told.
        stalled = [
            w for w in self.workers if not w.dead and not w.evicted and w.paused_until_ms > self.now_ms
        ]
        if stalled:
            self._run(max(w.paused_until_ms for w in stalled) - self.now_ms, 20, random.Random(self.now_ms))
        live = [w for w in self.workers if not w.dead and not w.evicted]
        if not live:
            return
        target = {p: live[owners[p % len(owners)] % len(live)] for p in range(S.PARTITIONS)}
        settling = []
        self._settled.clear()
        for worker in live:
            held = {p for p, owner in self.owner.items() if owner is worker}
            lost = held if eager else {p for p in held if target[p] is not worker}
            if lost:
                settling.append((worker, lost, worker.revoke(lost), self.now_ms))
        rng = random.Random(self.now_ms)
        self._run(
            int(self.settle_s * 1000) + 50,
            10,
            rng,
            until=lambda: all(w.dead or task.done() for w, _, task, _ in settling),
        )
        for worker, lost, _task, _ in settling:
            for partition in lost:
                if worker.dead or (worker.index, partition) not in self._settled:
                    self.history.unsettled.append((self.now_ms, partition))
                if target[partition] is worker and not worker.dead:
                    self.owner[partition] = None  # handed back: restored again, into its open table
        self._note_dead()
        live = [w for w in self.workers if not w.dead and not w.evicted]
        if not live:
            return
        self.generation += 1
        for partition in range(S.PARTITIONS):
            worker = target[partition] if not target[partition].dead else live[partition % len(live)]
            self.owner[partition] = worker
        assigning = []
        for worker in live:
            assigned = {p for p, owner in self.owner.items() if owner is worker}
            assigning.append((worker, worker.assign(assigned, self.generation, lambda: rng.randint(1, 50))))
        # Each member's assignment runs on its own loop (owner records written, tables restored).
        self._run(10 * 60_000, 10, rng, until=lambda: all(w.dead or task.done() for w, task in assigning))
        self._note_dead()

    # -- compaction -----------------------------------------------------------------

    def _compact(self, partition: int, tail: int) -> None:
        topic = self.config.changelog_topic
        part = self.kafka.partition(topic, partition)
        if not part.records:
            return
        cut = part.records[-tail].offset if 0 < tail <= len(part.records) else part.next_offset
        cut = min(cut, _first_young_fenced(part, self.now_ms))
        retention = DELETE_RETENTION_MS if Fault.TOMBSTONE_EXPIRY in self.faults else 10**15
        expired = len(part.expired)
        self.kafka.compact(topic, partition, cut, self.now_ms, retention)
        self.history.injected["compaction"] += 1
        self.history.injected["tombstone_expiry"] += len(part.expired) - expired

    # -- checks that read the engine's tables -----------------------------------------

    def violate(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, detail))

    def stopped(self, worker: SimWorker, exc: BaseException) -> None:
        self.violate("worker_stopped", f"{worker.name} (life {worker.life}) stopped: {exc!r}")

    def verify(self) -> None:
        """Compact each changelog partition whole, then check every quiet owner's table: its pending
        count, and its timers against a table rebuilt from the changelog into an empty dir."""
        for partition in range(S.PARTITIONS):
            self._compact(partition, 0)
            owner = self.owner[partition]
            if owner is None or owner.dead or not self._quiet(owner):
                continue
            self._compare(partition, owner)

    def _quiet(self, worker: SimWorker) -> bool:
        return worker.engine.idle and len(worker.producer) == 0 and len(worker.quiet) == 0

    def _compare(self, partition: int, owner: SimWorker) -> None:
        live = owner.table(partition)
        timers = {t.key: t.value for t in live.iter_pending()}
        if live.pending != len(timers):
            self.violate(
                "pending_count", f"p{partition} on {owner.name}: pending {live.pending}, {len(timers)} timers"
            )
        scratch = Path(tempfile.mkdtemp(dir=self.directory))
        try:
            rebuilt = PartitionTimers(scratch / "restored.db")
            topic, start, fence = self.config.changelog_topic, 0, OwnerFence()
            while True:
                found, start = self.kafka.read(topic, partition, start, 500, committed=False)
                if not found:
                    break
                records = [
                    (r.key, r.value) for r in found if r.key is not None and fence.admit(r.key, r.headers)
                ]
                rebuilt.apply(records, found[-1].offset, owner_epoch=fence.epoch)
            restored = {t.key: t.value for t in rebuilt.iter_pending()}
            if restored != timers or rebuilt.watermark != live.watermark or rebuilt.pending != live.pending:
                extra = sorted(k[9:].decode(errors="replace") for k in set(restored) - set(timers))
                missing = sorted(k[9:].decode(errors="replace") for k in set(timers) - set(restored))
                self.violate(
                    "restore_differs",
                    f"p{partition} on {owner.name}: restored has {len(restored)} timers (extra {extra[:5]}), "
                    f"live {len(timers)} (missing {missing[:5]}); "
                    f"watermark {rebuilt.watermark} vs {live.watermark}",
                )
            rebuilt.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # -- healing ------------------------------------------------------------------------

    def heal(self) -> None:
        """No more faults: every worker alive, one rebalance, time for every timer to fire."""
        for worker in self.workers:
            worker.crash_at = None
            worker.slow_until_ms = 0
            worker.paused_until_ms = 0
            if worker.hears_at_ms is not None:
                worker.hears_at_ms = self.now_ms
                self.history.paused = [
                    (name, stalled, min(heard, self.now_ms) if name == worker.name else heard, partition)
                    for name, stalled, heard, partition in self.history.paused
                ]
        self._zombies_hear()
        for osc in self.oscillators:
            osc.paused_until_ms = 0
        self._note_dead()
        for worker in self.workers:
            if worker.dead:
                worker.start(empty_dir=False)
        self._rebalance(tuple(range(S.PARTITIONS)))
        rng = random.Random(0)
        join_ms = int(self.config.join_max_wait_s * 1000)
        self._run(max(self.model.last_due_ms() - self.now_ms, 0) + 5_000, 50, rng)
        self._run(join_ms + 10_000, 50, rng, until=self._all_fired)
        self._run(2_000, 50, rng)  # sweeps and progress records land
        self.verify()
        for partition, owner in self.owner.items():
            if owner is not None and not owner.dead:
                table = owner.table(partition)
                self.final_tables[partition] = (len(list(table.iter_pending())), table.pending)
        for worker in self.workers:
            worker.crash(1.0)  # stops the loops and closes the tables

    def _all_fired(self) -> bool:
        delivered = {(r.value or b"") for r in self.kafka.partition(CALLBACKS, 0).records}
        return all(f"{w.timer_id}|{w.version}".encode() in delivered for w in self.model.must_fire())
