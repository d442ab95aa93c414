"""The sustained-rate search: which rates it tries, when a rate counts as held, what the report says."""

from __future__ import annotations

import numpy as np
import pytest

from bench.collector import Arrivals
from bench.render import NONE_FAILED, sustained_table
from bench.results import OURS, REDIS, Fire, Results, Sustained, SustainedStep
from bench.stats import lateness, lateness_growth
from bench.sustained import P99_LIMIT_MS, judge, next_rate
from bench.targets import MET, MISSED, evaluate


def search(capacity: int, start: int, steps: int) -> list[tuple[int, bool]]:
    """The rates the search tries against a system that holds exactly up to ``capacity``."""
    tried: list[tuple[int, bool]] = []
    rate = next_rate(tried, start)
    while rate is not None and len(tried) < steps:
        tried.append((rate, rate <= capacity))
        rate = next_rate(tried, start)
    return tried


def test_the_search_doubles_until_a_rate_fails_then_narrows_between_held_and_not():
    assert search(capacity=30_000, start=10_000, steps=5) == [
        (10_000, True),
        (20_000, True),
        (40_000, False),
        (28_000, True),
        (33_000, False),
    ]


def test_when_the_first_rate_fails_the_search_goes_down():
    assert [rate for rate, _ in search(capacity=3_000, start=10_000, steps=3)] == [10_000, 5_000, 2_500]


@pytest.mark.parametrize("capacity", [150, 7_000, 23_000, 64_000, 150_000])
def test_the_rates_found_bracket_what_the_system_holds(capacity: int):
    tried = search(capacity, start=10_000, steps=12)
    held = max(rate for rate, ok in tried if ok)
    failed = min(rate for rate, ok in tried if not ok and rate > held)
    assert held <= capacity < failed
    # Given steps enough, it stops once the two are within 15 % of each other.
    assert failed <= held * 1.15 + 100
    assert next_rate(tried, 10_000) is None


def steady(
    rate: int,
    seconds: int,
    late_ms: list[int] | None = None,
    received: int | None = None,
    on_tick: bool = True,
) -> Fire:
    """A steady workload of ``seconds`` whose timers are ``late_ms[s]`` late in due second ``s``,
    plus 20 ms, plus (``on_tick``, second mode) the wait for the tick after their second."""
    due = np.arange(rate * seconds, dtype=np.int64) * 1000 // rate + 1_000_000
    second = (due - due[0]) // 1000
    extra = np.array(late_ms or [0] * seconds, dtype=np.int64)[second]
    arrived = due + 20 + extra + ((1000 - (due % 1000)) if on_tick else 0)
    kept = slice(0, received)
    arrivals = Arrivals(due[kept], arrived[kept], arrived[kept], np.arange(due.size, dtype=np.int64)[kept])
    late = lateness(due.size, arrivals.due_ms, arrivals.fired_ms, arrivals.received_ms, arrivals.ids)
    fire = Fire(OURS, f"sustained-{rate}", int(due.size), float(rate), late, window_s=seconds)
    fire.arrivals = arrivals
    return fire


def test_a_rate_kept_up_with_is_held():
    step = judge(1_000, steady(1_000, 15))
    assert step.failed == ""
    assert abs(step.growth_ms) < 1
    assert step.fire.lateness.p99_ms <= P99_LIMIT_MS


def test_a_rate_whose_lateness_keeps_growing_is_not_held_even_within_the_p99_limit():
    growing = [10 * s for s in range(15)]  # 10 ms later every second: 140 ms over the hold
    assert judge(1_000, steady(1_000, 15, growing, on_tick=False)).failed == ""
    faster = [20 * s for s in range(15)]  # 280 ms
    step = judge(1_000, steady(1_000, 15, faster, on_tick=False))
    assert step.fire.lateness.p99_ms <= P99_LIMIT_MS
    assert step.failed == "backlog growing: lateness +280 ms from the first due second to the last"


def test_a_rate_late_at_p99_or_with_callbacks_missing_is_not_held_and_says_why():
    late = judge(1_000, steady(1_000, 15, [300] * 15))
    assert late.failed == "p99 1,310 ms > 1,100 ms"
    missing_fire = steady(1_000, 15, received=14_000)
    missing_fire.notes.append("1000 of 15000 callbacks not received within the tail timeout")
    missing = judge(1_000, missing_fire)
    assert missing.failed == "1000 of 15000 callbacks not received within the tail timeout"
    # The load generator falling behind is said, but only fails a rate with what it caused.
    lagging = steady(1_000, 15)
    lagging.notes.append("the load generator fell up to 800 ms behind its send schedule")
    assert judge(1_000, lagging).failed == ""
    lagging_late = steady(1_000, 15, [300] * 15)
    lagging_late.notes.append("the load generator fell up to 800 ms behind its send schedule")
    assert judge(1_000, lagging_late).failed == (
        "p99 1,310 ms > 1,100 ms; the load generator fell up to 800 ms behind its send schedule"
    )


def test_one_slow_second_at_the_end_is_not_a_growing_backlog():
    arrivals = steady(1_000, 15, [0] * 14 + [300]).arrivals
    assert arrivals is not None
    assert 0 < lateness_growth(arrivals.due_ms, arrivals.received_ms) < 200


def _run(ours: list[tuple[int, list[int]]], redis: list[tuple[int, list[int]]]) -> Results:
    """A run whose sustained searches tried each (rate, lateness by due second) in turn."""
    r = Results(profile="test", started="now", steady_lead_s=5.0)
    for system, tried in ((OURS, ours), (REDIS, redis)):
        found = Sustained(system, hold_s=15.0, p99_limit_ms=P99_LIMIT_MS)
        for rate, late in tried:
            fire = steady(rate, 15, late)
            fire.system = system
            found.steps.append(judge(rate, fire))
        r.sustained.append(found)
    return r


FINE, LATE = [0] * 15, [300] * 15


def test_the_report_gives_each_systems_rate_the_first_it_did_not_hold_and_the_ratio():
    run = _run(
        ours=[(100, FINE), (200, FINE), (400, LATE), (280, FINE), (330, LATE)],
        redis=[(100, FINE), (200, FINE), (400, FINE), (800, LATE), (570, FINE)],
    )
    table = "\n".join(sustained_table([run]))
    assert "| kafka-timers | 280/s | 522 | 1,013 | 330/s: p99 1,311 ms > 1,100 ms |" in table
    assert "| redis-zset | 570/s | 521 | 1,012 | 800/s: p99 1,310 ms > 1,100 ms |" in table
    assert "100 ✓, 200 ✓, 400 ✗, 280 ✓, 330 ✗" in table
    assert "kafka-timers held **49.1 %** of the rate redis-zset held (same run)." in table
    verdict = next(v for v in evaluate([run]) if v.target.startswith("Sustained rate"))
    assert (verdict.status, verdict.gap) == (MISSED, "short by 51 %")
    assert verdict.target.startswith("Sustained rate (held 15 s, p99 at the receiver ≤ 1.1 s")


def test_a_system_that_held_no_rate_shows_none_and_misses_the_target():
    run = _run(ours=[(100, LATE), (50, LATE)], redis=[(100, FINE)])
    found = run.sustained_of(OURS)
    assert found is not None and found.held is None
    table = "\n".join(sustained_table([run]))
    assert "| kafka-timers | none | — | — | 50/s: p99 1,320 ms > 1,100 ms |" in table
    assert f"| redis-zset | 100/s | 525 | 1,010 | {NONE_FAILED} | 100 ✓ |" in table
    verdict = next(v for v in evaluate([run]) if v.target.startswith("Sustained rate"))
    assert verdict.status == MISSED
    held_more = _run(ours=[(100, FINE), (200, FINE)], redis=[(100, FINE), (200, LATE)])
    assert next(v for v in evaluate([held_more]) if v.target.startswith("Sustained rate")).status == MET


def test_a_step_reads_back_from_the_results_file_as_measured():
    from bench.results import load_runs, plain

    run = _run(ours=[(100, FINE), (200, LATE)], redis=[(100, FINE)])
    back = load_runs([plain(run)])[0].sustained_of(OURS)
    assert back is not None and back.held is not None and back.not_held is not None
    assert (back.held.rate, back.not_held.rate, back.not_held.failed) == (100, 200, "p99 1,310 ms > 1,100 ms")
    assert isinstance(back.steps[0], SustainedStep)
    assert back.steps[0].fire.lateness == run.sustained[0].steps[0].fire.lateness
