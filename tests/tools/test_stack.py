"""The metrics reader that `make run`, the benchmarks and the integration tests share."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tools.stack import metric_sum, parse_metrics


def exposition() -> str:
    registry = CollectorRegistry()
    ticks = Counter("timers_ticks", "ticks", ["outcome"], registry=registry)
    ticks.labels("advanced").inc(3)
    ticks.labels("duplicate").inc(2)
    pending = Gauge("timers_pending", "pending", ["partition"], registry=registry)
    pending.labels("0").set(5)
    pending.labels("1").set(7)
    odd = Gauge("timers_odd", "odd labels", ["topic"], registry=registry)
    odd.labels('a "quoted" \\ topic').set(1)
    return generate_latest(registry).decode()


def test_samples_are_keyed_as_the_worker_exposes_them():
    samples = parse_metrics(exposition())
    assert samples['timers_ticks_total{outcome="advanced"}'] == 3
    assert samples['timers_pending{partition="1"}'] == 7
    # A label value is escaped as in the exposition, so a key can be copied from /metrics.
    assert samples['timers_odd{topic="a \\"quoted\\" \\\\ topic"}'] == 1


def test_a_metric_sums_over_its_labels_and_not_over_other_metrics():
    samples = parse_metrics(exposition())
    assert metric_sum(samples, "timers_ticks_total") == 5
    assert metric_sum(samples, 'timers_ticks_total{outcome="duplicate"}') == 2
    assert metric_sum(samples, "timers_pending") == 12
    assert metric_sum(samples, "timers_pend") == 0
