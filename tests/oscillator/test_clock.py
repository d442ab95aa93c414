"""The tick schedule: never early, never twice, and only the current second after a stall."""

from __future__ import annotations

import pytest

from oscillator.clock import TickSchedule
from tests.oscillator.fakes import FakeClock


def test_first_tick_is_the_second_already_begun() -> None:
    clock = FakeClock(1_000.3)
    schedule = TickSchedule(clock)

    assert schedule.take() == 1_000


def test_next_second_waits_for_its_boundary() -> None:
    clock = FakeClock(1_000.25)
    schedule = TickSchedule(clock)
    schedule.take()

    assert schedule.wait_s() == pytest.approx(0.75)
    clock.now = 1_000.999999
    assert schedule.take() is None
    clock.now = 1_001.0
    assert schedule.take() == 1_001


def test_same_second_is_never_handed_out_twice() -> None:
    clock = FakeClock(1_000.1)
    schedule = TickSchedule(clock)
    schedule.take()

    for _ in range(5):
        clock.advance(0.1)
        assert schedule.take() is None


def test_clock_walk_in_small_steps_gives_every_second_once_and_never_early() -> None:
    clock = FakeClock(5_000.013)
    schedule = TickSchedule(clock)
    taken: list[tuple[int, float]] = []
    while clock.now < 5_010.5:
        second = schedule.take()
        if second is not None:
            taken.append((second, clock.now))
        clock.advance(0.007)

    seconds = [second for second, _ in taken]
    assert seconds == list(range(5_000, 5_011))
    assert all(at >= second for second, at in taken)


def test_after_a_stall_only_the_current_second_is_ticked() -> None:
    clock = FakeClock(2_000.0)
    schedule = TickSchedule(clock)
    assert schedule.take() == 2_000

    clock.now = 2_007.4  # e.g. the process was paused for seven seconds
    assert schedule.take() == 2_007
    assert schedule.take() is None
    assert schedule.wait_s() == pytest.approx(0.6)


def test_clock_stepping_back_waits_instead_of_repeating_seconds() -> None:
    clock = FakeClock(3_005.2)
    schedule = TickSchedule(clock)
    assert schedule.take() == 3_005

    clock.now = 3_003.0  # NTP stepped the clock back two seconds
    assert schedule.take() is None
    assert schedule.wait_s() == pytest.approx(3.0)
    clock.now = 3_006.0
    assert schedule.take() == 3_006
