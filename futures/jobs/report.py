"""``timers-report``: when pending timers are due, and how late fired ones were. PNG and tables.

* Due-time histogram of the pending timers (of a snapshot, or of the log).
* Fire lateness from the FIRED events on `timer-events`: worker clock at
  dispatch minus due time (``at_ms - due_ms``), in buckets and percentiles.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from futures.jobs import compact, snapshot
from futures.jobs.config import JobConfig
from futures.jobs.logs import plan_log, read_events, read_requests
from futures.jobs.runner import add_spark_arguments, job_parser, run_main, spark_for, step

log = logging.getLogger("futures.jobs.report")

PROG = "timers-report"

BUCKETS = ("minute", "hour", "day")
_BUCKET_DAYS = {"minute": 1 / 1440, "hour": 1 / 24, "day": 1.0}

#: Lateness bucket upper bounds (ms) and labels; the last bucket is open.
LATENESS_EDGES_MS = (500, 1_000, 2_000, 5_000, 10_000, 60_000)
LATENESS_LABELS = ("<0.5s", "0.5-1s", "1-2s", "2-5s", "5-10s", "10-60s", ">=60s")


@dataclass
class Report:
    due: DataFrame  # bucket_ms (epoch ms, UTC start of the bucket), timers
    lateness: DataFrame  # bucket_index, bucket, timers
    lateness_stats: DataFrame  # one row: fired, p50_ms, p90_ms, p99_ms, max_ms


@dataclass(frozen=True)
class ReportTables:
    """The collected report: small, on the driver."""

    bucket: str
    due: list[tuple[int, int]]  # (bucket start, epoch ms; timers)
    lateness: list[tuple[str, int]]
    fired: int
    p50_ms: int | None
    p90_ms: int | None
    p99_ms: int | None
    max_ms: int | None


# -- extract -----------------------------------------------------------------


def extract(spark: SparkSession, config: JobConfig, snapshot_path: str | None) -> tuple[DataFrame, DataFrame]:
    """(pending timers, decoded events): the pending set of a snapshot or of the log, and every event."""
    plan, _ = plan_log(config.common)
    events = read_events(spark, config.common, plan.events)
    if snapshot_path:
        _, pending = snapshot.read(spark, snapshot_path)
    else:
        requests = read_requests(spark, config.common, plan.requests, config.parse_limits())
        pending = compact.compaction(requests, events, len(config.common.topics.ingress_formats)).pending
    return pending, events


# -- transform ---------------------------------------------------------------


def transform(pending: DataFrame, events: DataFrame, bucket: str = "hour") -> Report:
    """Histograms as small DataFrames. ``bucket``: minute, hour or day (UTC) for due times."""
    if bucket not in BUCKETS:
        raise ValueError(f"bucket {bucket!r}: use one of {', '.join(BUCKETS)}")
    due = (
        pending.select(F.unix_millis(F.date_trunc(bucket, F.timestamp_millis("due_ms"))).alias("bucket_ms"))
        .groupBy("bucket_ms")
        .agg(F.count(F.lit(1)).alias("timers"))
        .orderBy("bucket_ms")
    )
    fired = events.filter(F.col("kind") == "FIRED").select(
        F.greatest(F.col("at_ms") - F.col("due_ms"), F.lit(0)).alias("late_ms")
    )
    index = F.lit(len(LATENESS_EDGES_MS))
    for i, edge in reversed(list(enumerate(LATENESS_EDGES_MS))):
        index = F.when(F.col("late_ms") < edge, F.lit(i)).otherwise(index)
    labels = F.array(*[F.lit(label) for label in LATENESS_LABELS])
    lateness = (
        fired.select(index.alias("bucket_index"))
        .groupBy("bucket_index")
        .agg(F.count(F.lit(1)).alias("timers"))
        .withColumn("bucket", F.element_at(labels, F.col("bucket_index") + 1))
        .orderBy("bucket_index")
    )
    stats = fired.agg(
        F.count(F.lit(1)).alias("fired"),
        F.percentile_approx("late_ms", [0.5, 0.9, 0.99]).alias("quantiles"),
        F.max("late_ms").alias("max_ms"),
    ).select(
        "fired",
        F.col("quantiles")[0].alias("p50_ms"),
        F.col("quantiles")[1].alias("p90_ms"),
        F.col("quantiles")[2].alias("p99_ms"),
        "max_ms",
    )
    return Report(due, lateness, stats)


# -- load --------------------------------------------------------------------


def collect(report: Report, bucket: str) -> ReportTables:
    stats = report.lateness_stats.first()
    return ReportTables(
        bucket=bucket,
        due=[(int(r["bucket_ms"]), int(r["timers"])) for r in report.due.collect()],
        lateness=[(r["bucket"], int(r["timers"])) for r in report.lateness.collect()],
        fired=int(stats["fired"]) if stats else 0,
        p50_ms=stats["p50_ms"] if stats else None,
        p90_ms=stats["p90_ms"] if stats else None,
        p99_ms=stats["p99_ms"] if stats else None,
        max_ms=stats["max_ms"] if stats else None,
    )


def table_lines(tables: ReportTables) -> list[str]:
    lines = ["pending timers by due time (UTC)"]
    lines += [f"  {_utc(ms):%Y-%m-%d %H:%M}  {n:>10,}" for ms, n in tables.due] or ["  (none)"]
    lines.append(f"fire lateness of {tables.fired:,} fired timers")
    lines += [f"  {label:>8}  {n:>10,}" for label, n in tables.lateness] or ["  (none)"]
    if tables.fired:
        lines.append(
            f"  p50 {tables.p50_ms} ms, p90 {tables.p90_ms} ms, p99 {tables.p99_ms} ms, "
            f"max {tables.max_ms} ms"
        )
    return lines


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def write_png(tables: ReportTables, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, (due_ax, late_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    if tables.due:
        width = 0.8 * _BUCKET_DAYS[tables.bucket]  # matplotlib date units are days
        starts = [_utc(ms) for ms, _ in tables.due]
        due_ax.bar(starts, [n for _, n in tables.due], width=width, align="edge")
        fig.autofmt_xdate()
    due_ax.set_title(f"pending timers by due time (UTC), {sum(n for _, n in tables.due):,} in all")
    due_ax.set_ylabel("timers")
    late_ax.bar([label for label, _ in tables.lateness], [n for _, n in tables.lateness])
    title = f"fire lateness, {tables.fired:,} fired"
    if tables.fired:
        title += f" (p50 {tables.p50_ms} ms, p99 {tables.p99_ms} ms)"
    late_ax.set_title(title)
    late_ax.set_ylabel("timers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- main --------------------------------------------------------------------


def run(spark: SparkSession, config: JobConfig, snapshot_path: str | None, bucket: str) -> ReportTables:
    with step("reading"):
        pending, events = extract(spark, config, snapshot_path)
        return collect(transform(pending, events, bucket), bucket)


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser(PROG, "Due-time histogram of pending timers and fire lateness.")
    parser.add_argument(
        "--snapshot", metavar="PATH", help="pending timers of this snapshot (default: the log)"
    )
    parser.add_argument("--bucket", choices=BUCKETS, default="hour", help="due-time bucket (default hour)")
    parser.add_argument("--png", default="timers-report.png", help="where to write the chart")
    add_spark_arguments(parser)
    return parser


def _job(args: argparse.Namespace) -> int:
    config = JobConfig.from_env()
    spark = spark_for(args, PROG)
    try:
        tables = run(spark, config, args.snapshot, args.bucket)
    finally:
        spark.stop()
    for line in table_lines(tables):
        print(line)
    write_png(tables, args.png)
    print(f"chart: {args.png}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``timers-report``."""
    return run_main(PROG, build_parser(), _job, argv)


if __name__ == "__main__":
    raise SystemExit(main())
