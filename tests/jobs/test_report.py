"""The report: due-time histogram of pending timers and fire lateness, as tables and a PNG."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from futures.jobs.report import collect, table_lines, transform, write_png

HOUR = 3_600_000
T = 1_795_000_000_000 - 1_795_000_000_000 % HOUR  # a whole hour, epoch ms


def test_histograms_count_pending_by_hour_and_fired_by_lateness(spark: SparkSession, tmp_path: Path) -> None:
    pending = spark.createDataFrame(
        [(f"t{i}", T + due) for i, due in enumerate([0, 10, HOUR - 1, HOUR, 3 * HOUR + 5])],
        "timer_id string, due_ms long",
    )
    lateness_ms = [100, 499, 500, 900, 1_500, 70_000, -20]  # a negative one counts as on time
    events = spark.createDataFrame(
        [("FIRED", T, T + late) for late in lateness_ms] + [("SCHEDULED", T, T + 99_999)],
        "kind string, due_ms long, at_ms long",
    )
    tables = collect(transform(pending, events, "hour"), "hour")

    assert tables.due == [(T, 3), (T + HOUR, 1), (T + 3 * HOUR, 1)]
    assert tables.lateness == [("<0.5s", 3), ("0.5-1s", 2), ("1-2s", 1), (">=60s", 1)]
    assert (tables.fired, tables.max_ms) == (7, 70_000)

    text = "\n".join(table_lines(tables))
    assert "fire lateness of 7 fired timers" in text
    png = tmp_path / "report.png"
    write_png(tables, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
