"""``python -m bench.engine``: the engine's cost per timer, measured in-process with no broker."""

from __future__ import annotations

import shutil

import pytest

from bench.engine import PHASES, PhaseRun, checked, instructions_per_timer, run_phase
from futures.worker.engine import TimerEngine


@pytest.mark.parametrize("phase", PHASES)
def test_each_phase_accepts_or_fires_every_timer_it_measures(phase):
    run = run_phase(phase, 2_500)
    assert run.pending == (0 if phase in ("fire", "sweep") else 2_500)
    if phase == "sweep":
        assert run.unswept == 0
    assert run.cpu_s > 0
    assert checked(phase, 2_500, run) is run


def test_the_fire_phase_without_its_tick_leaves_the_hot_second_pending():
    # What --prepare-only counts for the fire phase: the load, not the firing.
    run = run_phase("fire", 2_500, prepare_only=True)
    assert run.pending == 2_500
    assert run.cpu_s == pytest.approx(0, abs=0.01)


def test_a_sweep_phase_whose_sweep_took_nothing_is_caught(monkeypatch):
    async def no_sweep(self: TimerEngine) -> bool:
        return False  # a turn that swept nothing and says nothing is left

    monkeypatch.setattr(TimerEngine, "turn", no_sweep)
    run = run_phase("sweep", 2_500)
    assert run.pending == 0 and run.unswept > 0
    with pytest.raises(SystemExit, match="tables left unswept afterwards"):
        checked("sweep", 2_500, run)


def test_a_phase_that_left_timers_behind_is_not_reported():
    with pytest.raises(SystemExit, match="3 timers pending afterwards, expected 0"):
        checked("fire", 10, PhaseRun(0.1, 3))
    with pytest.raises(SystemExit, match="7 timers pending afterwards, expected 10"):
        checked("batched", 10, PhaseRun(0.1, 7))
    with pytest.raises(SystemExit, match="2 tables left unswept afterwards"):
        checked("sweep", 10, PhaseRun(0.1, 0, unswept=2))


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind missing: make valgrind installs it")
def test_instructions_per_timer_are_counted_under_callgrind():
    per = instructions_per_timer("batched", 1_000)
    # Accepting a timer takes tens of thousands of instructions (its parse, its RocksDB writes,
    # its changelog record and event); the start of Python and the preparation are not in it.
    assert 10_000 < per < 500_000
