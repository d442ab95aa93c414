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
from dataclasses import dataclass

from futures.worker.callbacks import Callback
from futures.worker.config import WorkerConfig
from futures.worker.dispatch import Dispatcher
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.progress import InFlight
from futures.worker.table import PartitionTimers

#: What a callback in memory costs beyond its payload (bytes): the tuple, its table key, id and
#: header values, and its place in a precise window's heap, maps and sets (measured with
#: tracemalloc: 795 bytes a timer in a window of 20,000).
CALLBACK_OVERHEAD_BYTES = 800


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def callback_bytes(callback: Callback) -> int:
    """About what ``callback`` holds in memory (bytes): its payload, and the rest."""
    return len(callback.value) + CALLBACK_OVERHEAD_BYTES


@dataclass(frozen=True)
class FireBudget:
    """``TIMERS_FIRE_BUDGET_BYTES``: what the worker holds for firing, all partitions together.

    Shared out so that no part waits for another's bytes: a share for a firing — three pieces
    in flight and one being read, each a sixth of the share as stored timers and at most as
    much again once built into callbacks (:func:`piece_count`) — and the rest for what the
    mode builds ahead: the callbacks of the next second (second mode: half), or the open
    windows (precise mode: three quarters, a firing there fires only what a window left).
    """

    total: int
    precise: bool = False

    @property
    def firing(self) -> int:
        """Bytes a firing holds, all its pieces together."""
        return self.total // 4 if self.precise else self.total // 2

    @property
    def piece(self) -> int:
        """Bytes of stored timers a firing reads for one piece."""
        return max(self.firing // 6, 1)

    @property
    def ahead(self) -> int:
        """Bytes of callbacks built ahead: the lookahead's, or all open precise windows'."""
        return max(self.total - self.firing, 1)


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
        #: Progress records the changelog has not acknowledged yet: awaited without the lock.
        self.progress = InFlight(writer, clock)
        self.budget = FireBudget(config.fire_budget_bytes, config.precise)
