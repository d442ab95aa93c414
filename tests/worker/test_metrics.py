"""The worker's metrics: its lateness histogram, observed a chunk at a time, scrapes as a Prometheus
Histogram does; its tables' gauges read what RocksDB holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from futures.worker.metrics import LATENESS_BUCKETS, PieceHistogram, WorkerMetrics
from futures.worker.table import MEMTABLES, PartitionTimers, table_key

VALUES = [0.0, 0.004, 0.01, 0.0100001, 0.3, 1.0, 1.2, 2.0, 59.9, 3600.0, 7200.0, 0.5, 0.5]


def test_a_chunk_histogram_exposes_what_a_prometheus_histogram_exposes() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    chunked = PieceHistogram("lateness_seconds", "doc", LATENESS_BUCKETS, registry=ours)
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


@given(
    chunks=st.lists(
        st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False) | st.sampled_from(LATENESS_BUCKETS))
    )
)
def test_chunks_of_any_values_fall_in_the_buckets_a_prometheus_histogram_puts_them_in(
    chunks: list[list[float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    chunked = PieceHistogram("lateness_seconds", "doc", LATENESS_BUCKETS, registry=ours)
    plain = Histogram("lateness_seconds", "doc", buckets=LATENESS_BUCKETS, registry=theirs)
    for chunk in chunks:
        chunked.observe_many(chunk)
        for value in chunk:
            plain.observe(value)
    for le in [*map(str, LATENESS_BUCKETS), "+Inf"]:
        labels = {"le": le}
        assert ours.get_sample_value("lateness_seconds_bucket", labels) == theirs.get_sample_value(
            "lateness_seconds_bucket", labels
        )
    assert ours.get_sample_value("lateness_seconds_count") == sum(map(len, chunks))
    # The sum adds chunk by chunk: the same up to rounding.
    assert ours.get_sample_value("lateness_seconds_sum") == pytest.approx(
        theirs.get_sample_value("lateness_seconds_sum")
    )


def test_the_worker_counts_lateness_in_its_histogram() -> None:
    metrics = WorkerMetrics()
    metrics.lateness.observe_many([0.2, 0.7, 4.0])
    sample = metrics.registry.get_sample_value
    assert sample("timers_fire_lateness_seconds_count") == 3
    assert sample("timers_fire_lateness_seconds_bucket", {"le": "0.25"}) == 1
    assert sample("timers_fire_lateness_seconds_bucket", {"le": "5.0"}) == 3
    assert sample("timers_fire_lateness_seconds_sum") == 4.9


def test_the_tables_gauges_show_what_each_partition_holds_in_memory_and_on_disk(tmp_path: Path) -> None:
    metrics = WorkerMetrics()
    tables = {0: PartitionTimers(tmp_path / "p0"), 1: PartitionTimers(tmp_path / "p1")}
    metrics.watch_tables(lambda: tables)
    sample = metrics.registry.get_sample_value
    try:
        timers = [(table_key(1_000_000 + n, f"timer-{n}"), b"v" * 200) for n in range(2_000)]
        tables[0].apply(timers, None, pending_delta=len(timers))
        assert sample("timers_pending", {"partition": "0"}) == 2_000
        in_memory = sample("timers_table_memtable_bytes", {"partition": "0"})
        assert in_memory is not None and in_memory > 2_000 * 200
        assert sample("timers_table_sst_bytes", {"partition": "0"}) == 0

        tables[0]._db.flush()
        on_disk = sample("timers_table_sst_bytes", {"partition": "0"})
        assert on_disk is not None and on_disk > 0
        assert sample("timers_table_sst_bytes", {"partition": "1"}) == 0
        assert sample("timers_table_compaction_pending_bytes", {"partition": "0"}) is not None

        # A table closed while the scrape runs (its partition revoked) is left out, not an error.
        tables[1].close()
        assert sample("timers_table_sst_bytes", {"partition": "1"}) is None
        assert sample("timers_pending", {"partition": "1"}) == 0
        assert sample("timers_table_sst_bytes", {"partition": "0"}) == on_disk
    finally:
        tables[0].close()


def test_the_time_writes_waited_for_flushes_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = WorkerMetrics()
    metrics.watch_tables(dict)
    monkeypatch.setattr(MEMTABLES, "waited_s", 2.5)
    assert metrics.registry.get_sample_value("timers_table_flush_wait_seconds_total") == 2.5
