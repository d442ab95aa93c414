"""The tick loop end to end on a fake clock: what a worker would see, without a broker."""

from __future__ import annotations

from collections import defaultdict

from ktimers.shutdown import StopFlag
from oscillator.clock import TickSchedule
from oscillator.health import Readiness
from oscillator.metrics import OscillatorMetrics
from oscillator.producer import TickProducer
from oscillator.service import MAX_SLEEP_S, tick_loop
from tests.oscillator.fakes import FakeClock, FakeProducer, fatal_error


def run_loop(clock: FakeClock, producer: FakeProducer, until_s: float, partitions=lambda: 4, on_sleep=None):
    """Run tick_loop on ``clock`` until it reads ``until_s``; each sleep advances the clock."""
    stop = StopFlag()
    ticks = TickProducer(
        lambda: producer, "osc", "osc-a", OscillatorMetrics(), Readiness(5.0, clock=FakeClock(0)), clock
    )
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)
        if on_sleep is not None:
            on_sleep(clock)
        producer.deliver()
        if clock.now >= until_s:
            stop.request("test")

    tick_loop(TickSchedule(clock), ticks, partitions, stop, sleep=sleep)
    return sleeps


def test_every_partition_gets_every_second_once_never_early() -> None:
    clock = FakeClock(1_000.42)
    producer = FakeProducer()

    sleeps = run_loop(clock, producer, until_s=1_005.5)

    by_partition: dict[int, list[int]] = defaultdict(list)
    for record in producer.records:
        by_partition[record.partition].append(record.tick.second)
        assert record.tick.emitted_ms >= record.tick.second * 1000
    assert set(by_partition) == {0, 1, 2, 3}
    for seconds in by_partition.values():
        assert seconds == [1_000, 1_001, 1_002, 1_003, 1_004, 1_005]
    # Sleeps are sliced so SIGTERM is noticed quickly.
    assert max(sleeps) <= MAX_SLEEP_S
    assert producer.polls > 0


def test_a_stall_resumes_at_the_current_second() -> None:
    clock = FakeClock(1_000.0)
    producer = FakeProducer()

    def pause_once(clock: FakeClock) -> None:
        if 1_001.5 <= clock.now < 1_001.6:
            clock.advance(6.0)  # the process was frozen

    run_loop(clock, producer, until_s=1_009.2, partitions=lambda: 1, on_sleep=pause_once)

    assert [r.tick.second for r in producer.records] == [1_000, 1_001, 1_007, 1_008, 1_009]


def test_new_partitions_get_ticks_from_the_next_second() -> None:
    clock = FakeClock(1_000.0)
    producer = FakeProducer()

    run_loop(clock, producer, until_s=1_002.5, partitions=lambda: 2 if clock.now < 1_001.5 else 3)

    per_second = defaultdict(set)
    for record in producer.records:
        per_second[record.tick.second].add(record.partition)
    assert per_second == {1_000: {0, 1}, 1_001: {0, 1}, 1_002: {0, 1, 2}}


def test_a_fatal_producer_error_does_not_end_the_loop_the_next_tick_goes_out_on_a_new_producer() -> None:
    clock = FakeClock(1_000.0)
    made: list[FakeProducer] = []

    def producers() -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]

    stop = StopFlag()
    ticks = TickProducer(producers, "osc", "osc-a", OscillatorMetrics(), Readiness(5.0), clock)

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        made[-1].deliver(fatal_error() if len(made) == 1 else None)
        if clock.now > 1_003.5:
            stop.request("test")

    tick_loop(TickSchedule(clock), ticks, lambda: 1, stop, sleep=sleep)

    assert [r.tick.second for r in made[0].records] == [1_000]
    assert [r.tick.second for r in made[1].records] == [1_001, 1_002, 1_003]


def test_stop_before_the_first_tick_sends_nothing() -> None:
    producer = FakeProducer()
    stop = StopFlag()
    stop.request("SIGTERM")
    clock = FakeClock(1_000.0)
    ticks = TickProducer(lambda: producer, "osc", "osc-a", OscillatorMetrics(), Readiness(5.0), clock)

    tick_loop(TickSchedule(clock), ticks, lambda: 4, stop, sleep=lambda s: None)

    assert producer.records == []
