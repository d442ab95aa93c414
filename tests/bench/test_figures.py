"""How the harness turns observations into figures: these decide what the report claims."""

from __future__ import annotations

import numpy as np

from bench.profiling import summarize
from bench.stats import burst_rate, lateness, rate_series, rise_rate


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
