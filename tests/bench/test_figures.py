"""How the harness turns observations into figures: these decide what the report claims."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.aggregate import of_fire, rate, spread
from bench.profiling import summarize
from bench.render import capacity_growth_block, render, targets_block
from bench.results import OURS, REDIS, CapacityRun, CapacityStep, Fire, ProfileSummary, Results, Throughput
from bench.stats import burst_rate, lateness, rate_series, rise_rate
from bench.targets import MET, MISSED, NOT_MEASURED, evaluate, short_by


def ms(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_rise_rate_ignores_idle_time_before_and_after_the_rise():
    # Nothing for 10 s (worker joining), 1000 per second for 4 s, then idle again.
    samples = [(0.0, 0), (10.0, 0), (11.0, 1000), (12.0, 2000), (13.0, 3000), (14.0, 4000), (20.0, 4000)]
    assert rise_rate(samples, 0, 4000) == 1000.0


def test_rise_rate_of_a_rise_between_two_samples_is_a_lower_bound():
    assert rise_rate([(0.0, 0), (1.0, 0), (1.5, 500)], 0, 500) == 1000.0


def test_rise_rate_is_zero_when_nothing_rose():
    assert rise_rate([(0.0, 0), (1.0, 0)], 0, 500) == 0.0


def test_lateness_counts_early_callbacks_and_missing_ones():
    due = ms(1000, 1000, 2000, 2000)
    fired = ms(1500, 1500, 2400, 1990)
    received = ms(1600, 1700, 2500, 1995)  # the last one arrived 5 ms early
    late = lateness(5, due, fired, received, ids=ms(1, 2, 3, 4))
    assert late.received == 4 and late.missing == 1
    assert late.early == 1 and late.repeats == 0
    assert late.max_ms == 700 and late.min_ms == -5


def test_a_timer_received_twice_is_a_repeat_and_does_not_stand_in_for_a_missing_one():
    due = ms(1000, 1000, 2000)
    late = lateness(3, due, due, due + 10, ids=ms(7, 8, 7))  # timer 7 twice, the third never
    assert late.received == 3
    assert late.repeats == 1 and late.missing == 1


def test_burst_rate_is_callbacks_over_the_span_the_receiver_saw():
    assert burst_rate(ms(10_000, 10_500, 11_000)) == 3.0
    assert burst_rate(ms(10_000)) == 0.0


def test_rate_series_buckets_arrivals_per_second():
    starts, rates = rate_series(ms(1000, 1100, 1200, 2500), origin_ms=1000, bucket_s=1.0)
    assert starts == [0.0, 1.0]
    assert rates == [3.0, 1.0]


def test_profile_summary_ranks_own_time_and_our_functions_on_the_stack():
    raw = "\n".join(
        [
            "main (futures/worker/main.py:5);advance (futures/worker/engine.py:10);"
            "produce (futures/worker/kafka.py:3) 6",
            "main (futures/worker/main.py:5);advance (futures/worker/engine.py:12);"
            "select (selectors.py:468) 2",
            "main (futures/worker/main.py:5);_worker (concurrent/futures/thread.py:81) 2",
        ]
    )
    summary = summarize(raw, "hot-second")
    assert summary.samples == 10
    assert summary.top_self[0] == ("produce (futures/worker/kafka.py:3)", 60.0)
    # Lines of one function add up; the entry point and the stdlib's concurrent.futures are not ours.
    assert summary.top_ours == [
        ("advance (futures/worker/engine.py)", 80.0),
        ("produce (futures/worker/kafka.py)", 60.0),
    ]


def _run(ours_rate: float, redis_rate: float, max_late_ms: float = 900.0) -> Results:
    """A run with one hot second per system: only the figures the tests below read."""
    r = Results(profile="test", started="now", sizes={"hot_timers": 100_000})
    r.ceiling = Throughput("ceiling", 300_000, 250_000, 1.2)
    for system, fire_rate in ((OURS, ours_rate), (REDIS, redis_rate)):
        late = lateness(10, ms(1000), ms(1000), ms(1000 + int(max_late_ms)), ids=ms(1))
        r.fires.append(
            Fire(system=system, workload="hot-second", timers=10, fire_rate=fire_rate, lateness=late)
        )
    return r


def test_a_figure_over_runs_is_the_median_with_the_spread():
    runs = [_run(90_000, 150_000), _run(120_000, 160_000), _run(100_000, 100_000)]
    rates = spread(runs, of_fire(OURS, "hot-second", lambda f: f.fire_rate))
    assert rates.show(rate) == "100,000/s (90,000/s–120,000/s)"
    assert spread(runs[:1], of_fire(OURS, "hot-second", lambda f: f.fire_rate)).show(rate) == "90,000/s"
    assert spread(runs, of_fire(OURS, "precise-10000", lambda f: f.fire_rate)).show(rate) == "—"


def test_ratios_are_taken_within_each_run_before_the_median():
    # Per run: 60 %, 75 %, 100 %; median 75 %. The ratio of the medians would be 100 k / 150 k = 67 %.
    runs = [_run(90_000, 150_000), _run(120_000, 160_000), _run(100_000, 100_000)]
    share = next(v for v in evaluate(runs) if "of the Redis poller" in v.target)
    assert (share.status, share.gap) == (MISSED, "short by 25 %")
    assert share.measured == "75.0 % (60.0 %–100.0 %)"


def test_targets_give_verdicts_and_gaps_from_the_median():
    runs = [_run(50_000, 100_000, max_late_ms=2000), _run(60_000, 100_000, max_late_ms=1000)]
    verdicts = {v.target: v for v in evaluate(runs)}
    fire = verdicts[
        "Fire, hot second of 100,000: ≥ 100 % of the Redis poller's rate (in-memory Redis, same run)"
    ]
    assert (fire.status, fire.gap) == (MISSED, "short by 45 %")
    last = verdicts["Hot second of 100,000: last callback ≤ 1.5 s after due"]
    assert (last.status, last.gap) == (MET, "")
    # Nothing of precise mode or 10 M pending was run: not measured, never met.
    precise = "Precise mode, steady 10 k/s: p99 at the receiver ≤ 10 ms in every run"
    assert verdicts[precise].status == NOT_MEASURED
    assert verdicts["10 M pending: worker RSS ≤ 300 MB"].status == NOT_MEASURED


def test_a_callback_received_twice_misses_the_once_target():
    once = "Once: no callback received twice (no worker crashes in these runs)"
    runs = [_run(50_000, 100_000), _run(60_000, 100_000)]
    assert {v.target: v for v in evaluate(runs)}[once].status == MET
    fire = runs[1].fire(OURS, "hot-second")
    assert fire is not None
    fire.lateness = lateness(2, ms(1000, 1000), ms(1000, 1000), ms(1010, 1020), ids=ms(5, 5))
    verdict = {v.target: v for v in evaluate(runs)}[once]
    assert (verdict.status, verdict.measured) == (MISSED, "1 repeats of 3")


def test_a_missed_target_shows_the_profile_of_its_phase_and_what_would_close_it():
    runs = [_run(50_000, 100_000)]
    runs[0].profiles.append(
        ProfileSummary("hot-second", 200, [("produce (kafka.py:3)", 40.0)], [("send (dispatch.py)", 70.0)])
    )
    text = "\n".join(targets_block(runs))
    fire = text.split(
        "- **Fire, hot second of 100,000: ≥ 100 % of the Redis poller's rate (in-memory Redis, same run)**"
        " (short by 50 %).",
        1,
    )[1]
    profile, closes = fire.splitlines()[1:3]
    assert "phase `hot-second` (200 samples): own time `produce (kafka.py:3)` 40 %" in profile
    assert "`send (dispatch.py)` 70 %" in profile
    assert closes == "  - What would close it: [PERFORMANCE.md](PERFORMANCE.md#firing-a-timer)."
    # The ratio to the ceiling is missed in the same phase: its profile is not repeated.
    assert "- **Fire, hot second of 100,000: ≥ 80 % of the pass-through ceiling" in text
    assert "  - Profile: phase `hot-second`, as above." in text
    # Met targets get neither.
    assert "last callback ≤ 1.5 s after due** (" not in text
    every_missed = [v for v in evaluate(runs) if v.status == MISSED]
    assert every_missed and all(v.see for v in every_missed)


def _capacity(*sizes: tuple[int, float, float]) -> CapacityRun:
    """A `make bench-capacity` run with a size per (pending, worker RSS in MB, hot-second rate)."""
    steps = [CapacityStep(pending, rss_mb=rss, rates=[rate]) for pending, rss, rate in sizes]
    return CapacityRun("python -m bench.capacity", "today", 2, 100_000, 1, steps)


def test_a_capacity_run_compares_each_size_with_the_size_before():
    run = _capacity((0, 186, 60_000), (1_000_000, 186, 55_800), (10_000_000, 1_200, 50_220))
    assert run.shares() == [None, 0.93, 0.9]
    assert run.shares_of_first() == [None, 0.93, pytest.approx(0.837)]


def test_the_10_m_targets_are_judged_by_the_capacity_report_when_the_runs_loaded_less():
    runs = [_run(50_000, 100_000, max_late_ms=2000)]
    at_10m = _capacity((0, 150, 50_000), (1_000_000, 190, 44_000), (10_000_000, 200, 46_500))
    verdicts = {v.target: v for v in evaluate(runs, at_10m)}
    rss = verdicts["10 M pending: worker RSS ≤ 300 MB"]
    assert (rss.status, rss.measured) == (
        MET,
        "200 MB at 10,000,000 pending (`make bench-capacity`, today)",
    )
    assert verdicts["10 M pending: fire rate within 10 % of the rate at 0 pending"].status == MET
    slower = {
        v.target: v
        for v in evaluate(
            runs, _capacity((0, 150, 50_000), (1_000_000, 190, 44_000), (10_000_000, 350, 39_500))
        )
    }
    assert (
        slower["10 M pending: worker RSS ≤ 300 MB"].status,
        slower["10 M pending: worker RSS ≤ 300 MB"].gap,
    ) == (
        MISSED,
        "over by 50 MB",
    )
    assert slower["10 M pending: fire rate within 10 % of the rate at 0 pending"].gap == "short by 12 %"
    # A report that stopped short of 10 M judges nothing.
    short = {v.target: v for v in evaluate(runs, _capacity((0, 150, 50_000), (1_000_000, 190, 47_500)))}
    assert short["10 M pending: worker RSS ≤ 300 MB"].status == NOT_MEASURED


def test_the_10_m_memory_target_is_judged_by_the_peak_while_firing_not_the_memory_at_rest():
    runs = [_run(50_000, 100_000, max_late_ms=2000)]
    at_10m = _capacity((0, 150, 50_000), (10_000_000, 240, 50_000))
    at_10m.steps[-1].peak_rss_mb = 310
    rss = {v.target: v for v in evaluate(runs, at_10m)}["10 M pending: worker RSS ≤ 300 MB"]
    assert (rss.status, rss.gap) == (MISSED, "over by 10 MB")
    assert rss.measured.startswith("310 MB at its peak, firing, at 10,000,000 pending")
    assert "| 10,000,000 | — | 310 → 240 MB |" in "\n".join(capacity_growth_block(at_10m))


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_benchmark_pages_show_what_the_results_file_holds(tmp_path: Path):
    # Rendering the committed results again changes nothing: the pages are in step with them.
    for name in ("BENCHMARKS.md", "FAILOVER.md", "bench/results.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DOCS / name, tmp_path / name)
    render(tmp_path)
    for page in ("BENCHMARKS.md", "FAILOVER.md"):
        assert (tmp_path / page).read_text() == (DOCS / page).read_text(), page


def test_rendering_keeps_the_prose_around_the_tables_and_replaces_only_the_tables(tmp_path: Path):
    (tmp_path / "bench").mkdir()
    shutil.copy(DOCS / "bench" / "results.json", tmp_path / "bench" / "results.json")
    page = tmp_path / "FAILOVER.md"
    page.write_text(
        "# Failover\n\nProse before.\n\n"
        "<!-- results:failover -->\nstale\n<!-- /results:failover -->\n\nAfter.\n"
    )

    render(tmp_path)

    text = page.read_text()
    assert text.startswith(
        "# Failover\n\nProse before.\n\n<!-- results:failover -->\nMeasured by `python -m bench.failover"
    )
    assert "stale" not in text and text.endswith("<!-- /results:failover -->\n\nAfter.\n")


@pytest.mark.parametrize(
    ("value", "gap"),
    [(89.93, "short by 0.1 %"), (89.995, "short by 0.1 %"), (89.5, "short by 0.6 %"), (85.6, "short by 5 %")],
)
def test_a_miss_says_how_far_short_never_by_zero(value: float, gap: str) -> None:
    assert short_by(value, 90.0) == gap
