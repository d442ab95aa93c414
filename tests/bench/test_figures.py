"""How the harness turns observations into figures: these decide what the report claims."""

from __future__ import annotations

import numpy as np

from bench.aggregate import of_fire, rate, spread
from bench.capacity import Row, Step, read_report, report
from bench.profiling import summarize
from bench.results import OURS, REDIS, Fire, ProfileSummary, Results
from bench.stats import burst_rate, lateness, rate_series, rise_rate
from bench.targets import MET, MISSED, NOT_MEASURED, evaluate


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
    late = lateness(5, due, fired, received)
    assert late.received == 4 and late.missing == 1
    assert late.early == 1
    assert late.max_ms == 700 and late.min_ms == -5


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
    for system, fire_rate in ((OURS, ours_rate), (REDIS, redis_rate)):
        late = lateness(10, ms(1000), ms(1000), ms(1000 + int(max_late_ms)))
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
    assert share.status == MET
    assert share.measured == "75.0 % (60.0 %–100.0 %)"


def test_targets_give_verdicts_and_gaps_from_the_median():
    runs = [_run(50_000, 100_000, max_late_ms=2000), _run(60_000, 100_000, max_late_ms=1000)]
    verdicts = {v.target: v for v in evaluate(runs)}
    fire = verdicts["Fire, hot second of 100,000: ≥ 100 k/s"]
    assert (fire.status, fire.gap) == (MISSED, "short by 45 %")
    last = verdicts["Hot second of 100,000: last callback ≤ 1.5 s after due"]
    assert (last.status, last.gap) == (MET, "")
    # Nothing of precise mode or 10 M pending was run: not measured, never met.
    assert verdicts["Precise mode, steady 10 k/s: p99 at the receiver ≤ 25 ms"].status == NOT_MEASURED
    assert verdicts["10 M pending: worker RSS ≤ 300 MB"].status == NOT_MEASURED


def test_a_missed_target_shows_the_profile_of_its_phase_and_what_would_close_it():
    from bench.report import targets_section

    runs = [_run(50_000, 100_000)]
    runs[0].profiles.append(
        ProfileSummary("hot-second", 200, [("produce (kafka.py:3)", 40.0)], [("send (dispatch.py)", 70.0)])
    )
    text = "\n".join(targets_section(runs))
    fire = text.split("- **Fire, hot second of 100,000: ≥ 100 k/s** (short by 50 %).", 1)[1]
    profile, closes = fire.splitlines()[1:3]
    assert "phase `hot-second` (200 samples): own time `produce (kafka.py:3)` 40 %" in profile
    assert "`send (dispatch.py)` 70 %" in profile
    assert closes.startswith("  - What would close it: ") and "(PERFORMANCE.md#firing-a-timer)" in closes
    # The ratio to Redis is missed in the same phase: its profile is not repeated.
    assert "- **Fire, hot second of 100,000: ≥ 60 % of the Redis poller's rate" in text
    assert "  - Profile: phase `hot-second`, as above." in text
    # Met targets get neither.
    assert "last callback ≤ 1.5 s after due** (" not in text
    every_missed = [v for v in evaluate(runs) if v.status == MISSED]
    assert every_missed and all(v.closes for v in every_missed)


def test_a_hot_second_later_than_redis_is_put_down_to_the_fire_rate_not_the_tick():
    from bench.report import redis_ahead_section

    r = Results(profile="test", started="now", sizes={"hot_timers": 100})
    for system, last_ms, fire_rate in ((OURS, 1080, 95_000.0), (REDIS, 1000, 190_000.0)):
        due = ms(*[1000] * 100)
        arrived = due + np.linspace(last_ms - 200, last_ms, 100).astype(np.int64)
        late = lateness(100, due, arrived - 5, arrived)
        r.fires.append(
            Fire(system=system, workload="hot-second", timers=100, fire_rate=fire_rate, lateness=late)
        )
    text = "\n".join(redis_ahead_section([r]))
    lateness_line = next(
        line for line in text.splitlines() if line.startswith("- **Lateness p99, hot second")
    )
    assert "at its fire rate" in lateness_line and "path of the tick" not in lateness_line


def test_a_capacity_report_reads_back_as_its_sizes_memory_and_rate_shares():
    steps = [
        Step(0, rss_mb=186.2, rates=[58_000, 60_000], last_ms=[1800, 1700]),
        Step(1_000_000, load_s=25, rss_mb=186, rates=[55_000, 55_000], last_ms=[1900, 1900]),
        Step(10_000_000, load_s=240, rss_mb=1_200.4, rates=[49_500, 49_500], last_ms=[2000, 2100]),
    ]
    rows = read_report(report(steps, 100_000, "python -m bench.capacity"))
    assert [(r.pending, r.rss_mb, r.vs_before) for r in rows] == [
        (0, 186, None),
        (1_000_000, 186, 0.93),
        (10_000_000, 1_200, 0.9),
    ]
    assert rows[0].when.endswith("UTC")


def test_the_10_m_targets_are_judged_by_the_capacity_report_when_the_runs_loaded_less():
    runs = [_run(50_000, 100_000, max_late_ms=2000)]
    at_10m = [Row(1_000_000, 190, 1.1, "today"), Row(10_000_000, 200, 0.93, "today")]
    verdicts = {v.target: v for v in evaluate(runs, at_10m)}
    rss = verdicts["10 M pending: worker RSS ≤ 300 MB"]
    assert (rss.status, rss.measured) == (
        MET,
        "200 MB at 10,000,000 pending (`make bench-capacity`, today, above)",
    )
    assert verdicts["10 M pending: fire rate within 10 % of the rate at 1 M"].status == MET
    slower = {v.target: v for v in evaluate(runs, [Row(10_000_000, 350, 0.79, "today")])}
    assert (
        slower["10 M pending: worker RSS ≤ 300 MB"].status,
        slower["10 M pending: worker RSS ≤ 300 MB"].gap,
    ) == (
        MISSED,
        "over by 50 MB",
    )
    assert slower["10 M pending: fire rate within 10 % of the rate at 1 M"].gap == "short by 12 %"
    # A report that stopped short of 10 M judges nothing.
    short = {v.target: v for v in evaluate(runs, [Row(1_000_000, 190, 0.95, "today")])}
    assert short["10 M pending: worker RSS ≤ 300 MB"].status == NOT_MEASURED


def test_the_report_repeats_the_first_table_of_the_reports_measured_apart(tmp_path):
    from bench.report import measured_apart

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "jobs.md").write_text(
        "# Spark jobs\n\nRun on today: `python -m bench.jobs`.\n\n| master | rate |\n|---|---|\n"
        "| local[2] | **143 k/s** |\n\nMore text.\n\n| other | table |\n|---|---|\n"
    )
    lines = measured_apart(tmp_path)
    assert "Run on today: `python -m bench.jobs`." in lines
    assert "| local[2] | **143 k/s** |" in lines
    assert "| other | table |" not in lines  # only the first table
    assert "More: [bench/jobs.md](bench/jobs.md)." in lines
    assert not any("capacity" in line for line in lines)  # not measured: no section
