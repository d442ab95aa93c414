"""``python -m bench.engine``: what the engine's own code costs per timer, with no broker.

``make bench`` measures the whole system on a shared two-core machine, where runs of the same
code differ by up to a third: a change worth a few percent is lost in it. This measures only
the worker's engine, in this process — the partition tables in RocksDB under a temporary
directory, a producer that reports every record delivered at once — in three phases:

* ``single``: ingest of one ``Future`` per record, steps of 2,000 records;
* ``batched``: ingest of ``FutureBatch`` records of 1,000 timers, steps of 20 records;

  both with ids the client drew, as its records say (``kt-ids: new``), or with ``--ids named``
  ids a producer named, which the worker looks up in its id index;
* ``fire``: a hot second: timers due in one second, loaded first (not counted), then fired
  by one tick of each partition;
* ``sweep``: the same hot second loaded and fired (not counted), then swept: each fired
  timer's own tombstone, and its id index entry (:mod:`futures.worker.sweep`), the work a
  sustained rate adds to every fired timer when no tick waits.

It reports the main thread's CPU per timer; with ``--instructions``, the CPU instructions per
timer instead, counted by valgrind's callgrind (Debian's ``valgrind``): the same code on the
same input counts the same to a few parts in a thousand, however busy the machine (RocksDB's
background flushes and compactions, counted with the rest, move a little). A phase
is counted twice, once whole and once with only its preparation (``--prepare-only``), and the
difference divided by the timers. What the producer and the broker cost is not in these
figures; what the engine's Python, RocksDB and protobuf cost is.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

from futures.client.records import request_headers
from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.kafka import KafkaWriter
from futures.worker.main import GC_GEN0_THRESHOLD
from futures.worker.metrics import WorkerMetrics
from futures.worker.table import PartitionTimers
from ktimers.config import BrokerProfile, CommonConfig, KafkaConfig
from ktimers.producer import DeliveryCallback
from ktimers.wire import KIND_BATCH, KIND_FUTURE, Future, FutureBatch, Tick, encode_second_key

#: Where ``python -m bench.engine`` runs from (its callgrind runs too).
REPO = Path(__file__).resolve().parents[1]
PHASES = ("single", "batched", "fire", "sweep")
#: Whose ids the ingest phases' timers have: drawn by the client (``kt-ids: new``), or named.
IDS = ("drawn", "named")
#: The epoch second the engine's clock starts at; timers are due an hour later.
START_S = 1_795_000_000
PARTITIONS = 4
PAYLOAD = b"x" * 100
SINGLE_STEP = 2_000  # records an ingest step of single-Future records takes
BATCH_SIZE = 1_000  # timers a FutureBatch record holds
BATCH_STEP = 20  # FutureBatch records an ingest step takes


class _Delivered:
    """The parts of a confluent-kafka ``Message`` that the engine's delivery callbacks read."""

    __slots__ = ("_offset", "_partition")

    def __init__(self, partition: int, offset: int) -> None:
        self._partition = partition
        self._offset = offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


class InstantProducer:
    """A producer with no broker: every record is delivered at the next ``poll`` or ``flush``
    (``only_errors``: reported as confluent-kafka's ``delivery.report.only.error`` does, so
    not at all). Producers given the same ``ends`` write to one log: each record takes the next
    offset of its topic partition, as Kafka gives it (the worker checks its progress records'
    offsets against what it wrote, :mod:`futures.worker.restate`)."""

    def __init__(self, *, only_errors: bool = False, ends: Counter[tuple[str, int]] | None = None) -> None:
        self._queued: list[DeliveryCallback | None] = []
        self._where: list[tuple[str, int]] = []
        self._ends: Counter[tuple[str, int]] = Counter() if ends is None else ends
        self._only_errors = only_errors

    def produce(
        self,
        topic: str,
        value: object = None,
        key: object = None,
        partition: int = -1,
        callback: DeliveryCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: object = None,
    ) -> None:
        self._queued.append(callback or on_delivery)
        self._where.append((topic, partition if partition > 0 else 0))

    def poll(self, timeout: float = 0.0) -> int:
        queued, where, ends = self._queued, self._where, self._ends
        self._queued, self._where = [], []
        if self._only_errors:
            ends.update(where)  # counted in C: the producer's own cost stays out of the figures
            return len(queued)
        for on_delivery, at in zip(queued, where, strict=True):
            offset = ends[at]
            ends[at] = offset + 1
            if on_delivery is not None:
                on_delivery(None, _Delivered(at[1], offset))  # type: ignore[arg-type]
        return len(queued)

    def flush(self, timeout: float = -1.0) -> int:
        self.poll()
        return 0

    def __len__(self) -> int:
        return len(self._queued)


@dataclass
class Rig:
    """One engine on fresh tables under ``directory``, with a clock the phase moves."""

    directory: Path
    now_ms: int = START_S * 1000
    tables: dict[int, PartitionTimers] = field(default_factory=dict)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.config = WorkerConfig(common=CommonConfig(kafka=KafkaConfig(profile=BrokerProfile.CLUSTER)))
        log: Counter[tuple[str, int]] = Counter()  # the end of each topic partition
        writer = KafkaWriter(InstantProducer(ends=log), quiet=InstantProducer(only_errors=True, ends=log))  # type: ignore[arg-type]
        self.engine = TimerEngine(
            self.config,
            self.table,
            writer,
            WorkerMetrics(),
            clock=lambda: self.now_ms,
        )

    def table(self, partition: int) -> PartitionTimers:
        if partition not in self.tables:
            self.tables[partition] = PartitionTimers(self.directory / f"p{partition}")
        return self.tables[partition]

    def record(
        self, topic: str, partition: int, key: bytes | None, value: bytes, headers: tuple = ()
    ) -> SourceRecord:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[topic, partition] = offset + 1
        return SourceRecord(topic, partition, offset, key, value, headers)

    def close(self) -> None:
        for table in self.tables.values():
            table.close()


def _future(n: int, due_ms: int) -> Future:
    return Future(
        callBackTopic="orders", callBackKey=f"key-{n}", callBack=PAYLOAD, id=f"timer-{n}", due_ms=due_ms
    )


def _headers(kind: bytes, ids: str) -> tuple[tuple[str, str | bytes | None], ...]:
    """A request record's headers as the client writes them (ids it drew say so)."""
    return tuple(request_headers(kind, new_ids=ids == "drawn"))


def single_records(
    rig: Rig, count: int, due_ms: Callable[[int], int], ids: str = "drawn"
) -> list[list[SourceRecord]]:
    """Ingest steps of one ``Future`` per record, spread over the partitions; a step's records
    partition by partition, as the consumer hands them over (a fetched batch at a time)."""
    topic = rig.config.common.topics.request
    headers = _headers(KIND_FUTURE, ids)
    records = [
        rig.record(topic, n % PARTITIONS, None, _future(n, due_ms(n)).SerializeToString(), headers)
        for n in range(count)
    ]
    by_partition = attrgetter("partition")
    return [sorted(records[at : at + SINGLE_STEP], key=by_partition) for at in range(0, count, SINGLE_STEP)]


def batched_records(
    rig: Rig, count: int, due_ms: Callable[[int], int], ids: str = "drawn"
) -> list[list[SourceRecord]]:
    """Ingest steps of ``FutureBatch`` records, spread over the partitions."""
    topic = rig.config.common.topics.request
    headers = _headers(KIND_BATCH, ids)
    records = []
    for first in range(0, count, BATCH_SIZE):
        batch = FutureBatch(
            futures=[_future(n, due_ms(n)) for n in range(first, min(first + BATCH_SIZE, count))]
        )
        partition = (first // BATCH_SIZE) % PARTITIONS
        records.append(rig.record(topic, partition, None, batch.SerializeToString(), headers))
    return [records[at : at + BATCH_STEP] for at in range(0, len(records), BATCH_STEP)]


@dataclass(frozen=True)
class PhaseRun:
    cpu_s: float  # the main thread's CPU seconds in the measured part
    pending: int  # timers pending in the tables afterwards
    unswept: int = 0  # tables left with ``f`` records to sweep afterwards


async def _phase(rig: Rig, phase: str, count: int, prepare_only: bool, ids: str) -> PhaseRun:
    engine = rig.engine
    if phase in ("fire", "sweep"):
        due_s = START_S + 5
        # Loaded in batches (not counted): a hot second's timers, due across its second.
        for step in batched_records(rig, count, lambda n: due_s * 1000 + n % 1000):
            await engine.ingest(step)
        topic = rig.config.common.topics.oscillator
        # Due within second s, they fire on tick s + 1 (never early).
        tick_s = due_s + 1
        tick = Tick(second=tick_s, source="bench", emitted_ms=tick_s * 1000).SerializeToString()
        steps = [[rig.record(topic, p, encode_second_key(tick_s), tick) for p in range(PARTITIONS)]]
        rig.now_ms = tick_s * 1000 + 10
        apply: Callable[[Sequence[SourceRecord]], Awaitable[None]] = _fired(engine)
        if phase == "sweep":
            for step in steps:
                await apply(step)
            steps = [[]]
            apply = _swept(engine)
    else:
        make = single_records if phase == "single" else batched_records
        steps = make(rig, count, lambda n: (START_S + 3600) * 1000 + n, ids)
        apply = engine.ingest
    # As the worker runs: what exists now out of the cycle collector's sight (futures/worker/main.py).
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    started = time.thread_time()
    if not prepare_only:
        for step in steps:
            await apply(step)
        await engine.landed()
    spent = time.thread_time() - started
    tables = rig.tables.values()
    # Checked only where it is cheap, after a sweep: read in the preparation run (which holds
    # the unswept records the sweep takes), it would count against the sweep, and after a
    # firing for it.
    swept = phase == "sweep" and not prepare_only
    return PhaseRun(
        spent,
        sum(table.pending for table in tables),
        sum(len(table.fired_listings(1)) for table in tables) if swept else 0,
    )


def _fired(engine: TimerEngine) -> Callable[[Sequence[SourceRecord]], Awaitable[None]]:
    """Ticks taken as the consumer hands them over, and fired as the firing task's turn does
    (without the sweep step that follows it there: measured on its own)."""

    async def fire(ticks: Sequence[SourceRecord]) -> None:
        engine.note_ticks(ticks)
        await engine.fire_ready()
        await engine.landed()

    return fire


def _swept(engine: TimerEngine) -> Callable[[Sequence[SourceRecord]], Awaitable[None]]:
    """The firing task's turns while no tick waits, until nothing is left to sweep."""

    async def sweep(_: Sequence[SourceRecord]) -> None:
        while await engine.turn():
            pass

    return sweep


def run_phase(phase: str, count: int, *, prepare_only: bool = False, ids: str = "drawn") -> PhaseRun:
    """Run ``phase`` over ``count`` timers on fresh tables (``prepare_only``: all but its measured part)."""
    directory = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    rig = Rig(directory)
    try:
        return asyncio.run(_phase(rig, phase, count, prepare_only, ids))
    finally:
        rig.close()
        shutil.rmtree(directory, ignore_errors=True)


def checked(phase: str, count: int, run: PhaseRun) -> PhaseRun:
    """``run``, if it did what it measures: every timer accepted, or every one fired."""
    expected = 0 if phase in ("fire", "sweep") else count
    if run.pending != expected:
        raise SystemExit(
            f"bench.engine {phase}: {run.pending:,} timers pending afterwards, expected {expected:,}"
        )
    if phase == "sweep" and run.unswept:
        raise SystemExit(f"bench.engine sweep: {run.unswept} tables left unswept afterwards")
    return run


_REFS = re.compile(r"(?:Collected|I\s+refs)\s*:\s*([\d,]+)")


def count_instructions(phase: str, count: int, prepare_only: bool, ids: str = "drawn") -> int:
    """CPU instructions of a whole run of this module for ``phase`` under callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("bench.engine --instructions needs valgrind: apt-get install valgrind")
    command = [
        valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, "-m", "bench.engine", "--phase", phase, "--count", str(count),
        "--ids", ids, "--counted",
    ]  # fmt: skip
    if prepare_only:
        command.append("--prepare-only")
    # Python's string hashes are seeded per process: fixed, dicts are laid out the same every run.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, check=False)  # noqa: S603
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"bench.engine: callgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def instructions_per_timer(phase: str, count: int, ids: str = "drawn") -> float:
    """(whole run − preparation only) / ``count``, the two runs side by side."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        whole = pool.submit(count_instructions, phase, count, False, ids)
        prepared = pool.submit(count_instructions, phase, count, True, ids)
        return (whole.result() - prepared.result()) / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__)
    parser.add_argument("--phase", choices=PHASES, action="append", help="a phase (default: all)")
    parser.add_argument("--count", type=int, default=20_000, help="timers per phase (default 20,000)")
    parser.add_argument("--repeat", type=int, default=3, help="CPU time: runs per phase (median)")
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    parser.add_argument(
        "--ids",
        choices=IDS,
        default="drawn",
        help="ingest: ids the client drew (kt-ids: new, not looked up; the default) or ids the "
        "producer named (each looked up)",
    )
    # The runs count_instructions makes: one phase, once, in full or only its preparation.
    parser.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prepare-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    phases = args.phase or list(PHASES)
    if args.counted:
        run = run_phase(phases[0], args.count, prepare_only=args.prepare_only, ids=args.ids)
        if not args.prepare_only:
            checked(phases[0], args.count, run)
        return 0
    for phase in phases:
        if args.instructions:
            per = instructions_per_timer(phase, args.count, args.ids)
            print(f"{phase}: {per:,.0f} instructions per timer ({args.count:,} timers)", flush=True)
        else:
            runs = sorted(
                checked(phase, args.count, run_phase(phase, args.count, ids=args.ids)).cpu_s
                for _ in range(args.repeat)
            )
            median = runs[len(runs) // 2] / args.count * 1e6
            spread = ", ".join(f"{r / args.count * 1e6:.2f}" for r in runs)
            print(
                f"{phase}: {median:.2f} µs CPU per timer (runs: {spread}; {args.count:,} timers)", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
