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
from futures.worker.table import PartitionTimers

#: What a callback in memory costs beyond its payload and stored timer (bytes): the tuple, its
#: key, id and header values (measured: ~0.4 KB for a timer with a 100-byte payload).
CALLBACK_OVERHEAD_BYTES = 300


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def callback_bytes(callback: Callback) -> int:
    """About what ``callback`` holds in memory (bytes): its payload twice (the value it sends and
    the stored timer it was built from), and the rest."""
    return len(callback.value) + len(callback.stored) + CALLBACK_OVERHEAD_BYTES


@dataclass(frozen=True)
class FireBudget:
    """``TIMERS_FIRE_BUDGET_BYTES``: what the worker holds for firing, all partitions together.

    Shared out so that no part waits for another's bytes: half for a firing — three pieces in
    flight and one being read, each a twelfth as stored timers, about a sixth once built into
    callbacks (which hold each payload twice) — and half for what the mode builds ahead: the
    callbacks of the next second (second mode) or the open windows (precise mode).
    """

    total: int

    @property
    def piece(self) -> int:
        """Bytes of stored timers a firing reads for one piece."""
        return max(self.total // 12, 1)

    @property
    def ahead(self) -> int:
        """Bytes of callbacks built ahead: the lookahead's, or all open precise windows'."""
        return max(self.total // 2, 1)


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
        self.budget = FireBudget(config.fire_budget_bytes)
