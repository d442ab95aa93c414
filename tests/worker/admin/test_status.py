"""WorkerStatus: what the admin page shows of ticks, firings and dead letters, in bounded memory."""

from __future__ import annotations

from futures.worker.status import WorkerStatus
from ktimers.wire import UNNAMED_SOURCE, Tick, decode_tick, encode_second_key

T = 1_795_000_000
T_MS = T * 1000


class Clock:
    def __init__(self) -> None:
        self.ms = T_MS

    def __call__(self) -> int:
        return self.ms


def tick(status: WorkerStatus, partition: int, second: int, source: str | None) -> None:
    """A tick record as the engine reads it: decoded, then reported to the status."""
    value = Tick(second=second, source=source).SerializeToString() if source is not None else None
    decoded, name = decode_tick(encode_second_key(second), value)
    assert decoded == second
    status.tick(partition, decoded, name)


def test_ticks_are_kept_per_partition_and_per_oscillator() -> None:
    clock = Clock()
    status = WorkerStatus(clock=clock)
    tick(status, 0, T, "osc-a")
    clock.ms += 400
    tick(status, 0, T, "osc-b")
    tick(status, 1, T - 5, None)  # an old seed tick: key only
    clock.ms += 600
    tick(status, 0, T + 1, "osc-a")

    ticks = status.partition_ticks()
    assert (ticks[0].second, ticks[0].received_ms, ticks[0].source) == (T + 1, T_MS + 1000, "osc-a")
    assert (ticks[1].second, ticks[1].source) == (T - 5, UNNAMED_SOURCE)
    seen = {o.source: o for o in status.oscillators()}
    assert (seen["osc-a"].last_second, seen["osc-a"].ticks, seen["osc-a"].last_seen_ms) == (
        T + 1,
        2,
        T_MS + 1000,
    )
    assert (seen["osc-b"].last_second, seen["osc-b"].ticks) == (T, 1)
    assert status.oscillators()[0].source == "osc-a"  # most recently seen first


def test_an_old_tick_does_not_move_the_second_back() -> None:
    status = WorkerStatus(clock=Clock())
    tick(status, 0, T + 3, "osc-a")
    tick(status, 0, T, "osc-b")
    assert status.partition_ticks()[0].second == T + 3


def test_oscillators_are_bounded_dropping_the_least_recently_seen() -> None:
    status = WorkerStatus(max_oscillators=3, clock=Clock())
    for name in ("a", "b", "c", "a", "d"):
        tick(status, 0, T, name)
    assert [o.source for o in status.oscillators()] == ["d", "a", "c"]


def test_firings_lateness_and_rate() -> None:
    clock = Clock()
    status = WorkerStatus(recent_firings=3, clock=clock)
    # 100 firings 0..99 ms late in the last minute, and 5 from two minutes ago.
    for i in range(5):
        status.fired(f"old-{i}", 0, T_MS - 120_000, T_MS - 120_000)
    for i in range(100):
        status.fired(f"t-{i}", i % 4, T_MS - 2000 + i * 10, T_MS - 2000 + i * 11)
    assert status.fired_last_minute() == 100
    assert [f.timer_id for f in status.recent_firings(10)] == ["t-99", "t-98", "t-97"]  # ring of 3
    lateness = status.lateness()
    assert lateness.samples == 105
    assert lateness.p50_s == 0.047 and lateness.p99_s == 0.098 and lateness.max_s == 0.099
    clock.ms += 61_000
    assert status.fired_last_minute() == 0


def test_no_firings_yet() -> None:
    status = WorkerStatus(clock=Clock())
    assert status.lateness().p50_s is None and status.recent_firings(5) == []
    assert status.fired_last_minute() == 0


def test_lateness_samples_are_bounded() -> None:
    status = WorkerStatus(lateness_samples=10, clock=Clock())
    for i in range(1000):
        status.fired("x", 0, T_MS, T_MS + i)
    assert status.lateness().samples == 10 and status.lateness().p50_s == 0.994


def test_dead_letters_are_counted_by_reason() -> None:
    clock = Clock()
    status = WorkerStatus(clock=clock)
    status.dead_letter("undecodable")
    clock.ms += 5
    status.dead_letter("undecodable")
    status.dead_letter("too-late")
    letters = status.dead_letters()
    assert (letters["undecodable"].count, letters["undecodable"].last_ms) == (2, T_MS + 5)
    assert letters["too-late"].count == 1
