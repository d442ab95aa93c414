"""One run of a schedule in a fresh world, and its outcome."""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.simulation.checker import check
from tests.simulation.faults import Fault
from tests.simulation.schedule import Step, generate
from tests.simulation.world import CALLBACKS, Violation, World


@dataclass
class Outcome:
    seed: int
    steps: int
    violations: list[Violation]
    injected: Counter[str] = field(default_factory=Counter)
    callbacks: int = 0

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def kinds(self) -> set[str]:
        return {v.invariant for v in self.violations}


def run_schedule(
    schedule: list[Step], faults: frozenset[Fault], seed: int, directory: Path | None = None
) -> Outcome:
    """Run ``schedule`` in a fresh world (tables under ``directory`` or a temp dir), heal, check."""
    scratch = Path(tempfile.mkdtemp(prefix="ktsim-", dir=directory))
    quiet = logging.getLogger("futures")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the engine's warnings are the faults doing their job
    with warnings.catch_warnings():
        # A crashed worker's coroutines never run again: that is the crash, not a bug.
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        try:
            return _run(schedule, faults, seed, scratch)
        finally:
            quiet.setLevel(level)
            shutil.rmtree(scratch, ignore_errors=True)


def _run(schedule: list[Step], faults: frozenset[Fault], seed: int, scratch: Path) -> Outcome:
    world = World(scratch, faults, seed)
    world.run(schedule)
    violations = check(world)
    world.history.injected["restated"] += sum(
        int(worker.metrics.restated._value.get())  # noqa: SLF001
        for worker in world.workers
    )
    callbacks = len(world.kafka.partition(CALLBACKS, 0).records)
    return Outcome(seed, len(schedule), violations, world.history.injected, callbacks)


def run_seed(seed: int, steps: int, faults: frozenset[Fault]) -> tuple[list[Step], Outcome]:
    schedule = generate(seed, steps, faults, settle_s=World.settle_time_s())
    return schedule, run_schedule(schedule, faults, seed)
