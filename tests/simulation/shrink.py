"""The shortest schedule that still fails: drop steps while a violation of the same kind remains.

Delta debugging in its simplest form: try dropping chunks of halving size, then single steps,
keeping every drop after which the run still shows one of the invariants the original broke.
Each try is a whole run, so a shrink is bounded by ``max_runs``.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.simulation.faults import Fault
from tests.simulation.run import Outcome, run_schedule
from tests.simulation.schedule import Step


def shrink(
    schedule: list[Step],
    faults: frozenset[Fault],
    seed: int,
    kinds: set[str],
    max_runs: int = 200,
    on_try: Callable[[int, int], None] = lambda runs, length: None,
) -> tuple[list[Step], Outcome | None]:
    """A sub-list of ``schedule`` whose run still breaks one of ``kinds``, and that run's outcome."""
    best, outcome, runs = list(schedule), None, 0

    def fails(candidate: list[Step]) -> Outcome | None:
        nonlocal runs
        runs += 1
        result = run_schedule(candidate, faults, seed)
        on_try(runs, len(candidate))
        return result if result.kinds() & kinds else None

    chunk = max(len(best) // 2, 1)
    while chunk >= 1 and runs < max_runs:
        start, progressed = 0, False
        while start < len(best) and runs < max_runs:
            candidate = best[:start] + best[start + chunk :]
            result = fails(candidate) if candidate else None
            if result is not None:
                best, outcome, progressed = candidate, result, True
            else:
                start += chunk
        if not progressed:
            chunk //= 2
    return best, outcome
