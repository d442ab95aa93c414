"""The worker's lateness histogram, observed a chunk at a time, scrapes as a Prometheus Histogram does."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from futures.worker.metrics import LATENESS_BUCKETS, ChunkHistogram, WorkerMetrics

VALUES = [0.0, 0.004, 0.01, 0.0100001, 0.3, 1.0, 1.2, 2.0, 59.9, 3600.0, 7200.0, 0.5, 0.5]


def test_a_chunk_histogram_exposes_what_a_prometheus_histogram_exposes() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    chunked = ChunkHistogram("lateness_seconds", "doc", LATENESS_BUCKETS, registry=ours)
    plain = Histogram("lateness_seconds", "doc", buckets=LATENESS_BUCKETS, registry=theirs)
    chunked.observe_many(VALUES[:5])
    chunked.observe_many([])
    chunked.observe_many(VALUES[5:])
    chunked.observe(0.02)
    for value in [*VALUES, 0.02]:
        plain.observe(value)

    def lines(registry: CollectorRegistry) -> list[str]:
        # prometheus_client adds a _created sample to its own histograms; the rest must match.
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert lines(ours) == lines(theirs)


def test_the_worker_counts_lateness_in_its_histogram() -> None:
    metrics = WorkerMetrics()
    metrics.lateness.observe_many([0.2, 0.7, 4.0])
    sample = metrics.registry.get_sample_value
    assert sample("timers_fire_lateness_seconds_count") == 3
    assert sample("timers_fire_lateness_seconds_bucket", {"le": "0.25"}) == 1
    assert sample("timers_fire_lateness_seconds_bucket", {"le": "5.0"}) == 3
    assert sample("timers_fire_lateness_seconds_sum") == 4.9
