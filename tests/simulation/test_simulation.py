"""Seeded simulations of the worker's world against the production engine (docs/simulation.md).

Each seed draws a schedule of requests, ticks and faults (:data:`DEFAULT`: every fault kind but
the known holes), runs it, heals the world and checks every invariant. A failure names the seed
and the shortest schedule that still fails; ``make simulate SEED=<seed> RUNS=1`` runs it again.
"""

from __future__ import annotations

import pytest

from futures.worker.ingest import Ingest
from tests.simulation.faults import DEFAULT, KNOWN_HOLES, Fault, parse
from tests.simulation.run import run_schedule, run_seed
from tests.simulation.schedule import Advance, Cancel, Schedule, Step, generate
from tests.simulation.shrink import shrink
from tests.simulation.world import World

SEEDS = range(16)
STEPS = 250


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeded_world_breaks_no_invariant(seed: int) -> None:
    schedule, outcome = run_seed(seed, STEPS, DEFAULT)
    if outcome.failed:
        shortest, _ = shrink(schedule, DEFAULT, seed, outcome.kinds(), max_runs=60)
        steps = "\n".join(f"  {step}" for step in shortest)
        violations = "\n".join(f"  {v.invariant}: {v.detail}" for v in outcome.violations[:10])
        pytest.fail(
            f"seed {seed} broke {sorted(outcome.kinds())}:\n{violations}\n"
            f"shortest schedule ({len(shortest)} of {len(schedule)} steps):\n{steps}"
        )
    assert outcome.callbacks > 0


def test_the_seeds_inject_every_fault_kind_of_the_default() -> None:
    """The fixed seeds of :func:`test_a_seeded_world_breaks_no_invariant` do reach each fault."""
    kinds: set[str] = set()
    for seed in SEEDS:
        for step in generate(seed, STEPS, DEFAULT, World.settle_time_s()):
            kinds.add(type(step).__name__)
    assert {"Crash", "Restart", "Rebalance", "Compact", "TickFault", "PauseOscillator", "Slow"} <= kinds


def test_a_seed_runs_the_same_every_time() -> None:
    first = run_seed(3, 120, DEFAULT)[1]
    again = run_seed(3, 120, DEFAULT)[1]
    assert (first.callbacks, first.injected) == (again.callbacks, again.injected)


def test_a_failing_schedule_shrinks_to_the_steps_that_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ingest, "_cancel", lambda self, request, part: None)  # cancels dropped
    schedule: list[Step] = [
        Advance(500, 20, 1),
        Schedule(0, 1, 4_000),
        Advance(300, 20, 2),
        Schedule(1, 2, 3_000),
        Schedule(2, 3, 9_000),
        Cancel(0, 4),
        Advance(700, 20, 3),
        Schedule(3, 5, 2_000),
        Advance(6_000, 20, 4),
    ]
    assert "superseded_fired" in run_schedule(schedule, DEFAULT, 1).kinds()
    shortest, outcome = shrink(schedule, DEFAULT, 1, {"superseded_fired"})
    assert outcome is not None and "superseded_fired" in outcome.kinds()
    assert Schedule(0, 1, 4_000) in shortest and Cancel(0, 4) in shortest
    assert len(shortest) <= 3


def test_fault_specs_name_the_kinds_and_the_known_holes_stay_out_of_the_default() -> None:
    assert not DEFAULT & set(KNOWN_HOLES)
    assert parse("+bogus_tick") == DEFAULT | {Fault.BOGUS_TICK}
    assert parse("-crash") == DEFAULT - {Fault.CRASH}
    assert parse("crash,rebalance") == {Fault.CRASH, Fault.REBALANCE}
    with pytest.raises(ValueError, match="unknown fault"):
        parse("+meteor")
