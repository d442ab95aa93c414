"""What the parts of the engine share: the tables, the producer, the clock, the lock, the byte budget.

The engine's parts — ingest (:mod:`~futures.worker.ingest`), the firing
(:mod:`~futures.worker.firing`), the changelog write (:mod:`~futures.worker.changelog`),
callbacks built ahead (:mod:`~futures.worker.lookahead`) and precise mode
(:mod:`~futures.worker.precise`) — each take an :class:`EngineContext`, built once by
:class:`~futures.worker.engine.TimerEngine`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from futures.worker.callbacks import Callback
from futures.worker.config import FireBudget, WorkerConfig
from futures.worker.dispatch import Dispatcher
from futures.worker.gaps import GapReader
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.progress import InFlight
from futures.worker.table import PartitionTimers

#: What a callback in memory costs beyond its payload (bytes): the tuple, its table key, id and
#: header values, and its place in a precise window's heap, maps and sets: tracemalloc's
#: figure, rounded up (docs/PERFORMANCE.md#lateness, *A hot second in precise mode*).
CALLBACK_OVERHEAD_BYTES = 800


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def callback_bytes(callback: Callback) -> int:
    """About what ``callback`` holds in memory (bytes): its payload, and the rest."""
    return len(callback.value) + CALLBACK_OVERHEAD_BYTES


def piece_count(count: int, room: int) -> int:
    """How many of ``count`` timers a piece with ``room`` bytes left takes: no more than its
    callbacks' overhead fits in that room again (small payloads; at least one)."""
    return max(min(count, room // CALLBACK_OVERHEAD_BYTES), 1)


class EngineContext:
    """The engine's shared state (see the module docstring). ``owns`` is replaced by one that
    owns nothing when the worker must stop (``TimerEngine._fatal``)."""

    def __init__(
        self,
        config: WorkerConfig,
        tables: Callable[[int], PartitionTimers],
        writer: KafkaWriter,
        dispatch: Dispatcher,
        metrics: WorkerMetrics,
        clock: Callable[[], int],
        lock: asyncio.Lock,
        owns: Callable[[int], bool],
        reader: GapReader | None = None,
    ) -> None:
        self.config = config
        self.tables = tables
        self.writer = writer
        self.dispatch = dispatch
        self.metrics = metrics
        self.clock = clock
        # Ingest and firing both mutate the tables; one at a time keeps the staged
        # overlay, the watermark checks and the changelog order consistent. The
        # store shares it, to close revoked partitions between mutations.
        self.lock = lock
        self.owns = owns
        #: Reads ranges of a topic back: the request topics' holes, and the changelog where another
        #: writer's records landed (:mod:`futures.worker.restate`). None: neither is read.
        self.reader = reader
        #: Progress records the changelog has not acknowledged yet: awaited without the lock.
        self.progress = InFlight(writer, clock)
        self.budget = FireBudget(config.fire_budget_bytes, config.precise)
