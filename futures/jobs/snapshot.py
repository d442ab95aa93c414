"""Snapshots of the pending set: Parquet by due date, and a manifest of what they cover.

Layout of a snapshot directory (any path Spark can write: local, HDFS, S3...)::

    <path>/timers/due_date=2026-11-23/part-*.parquet   the pending timers
    <path>/manifest/part-*.txt                          one JSON line, written last

A snapshot without a manifest is incomplete (the job that wrote it failed) and
is refused. The manifest records the cluster, the partition count and the
offset range of every partition it covers, so a snapshot is never silently
applied to a topic it does not describe.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from futures.jobs.errors import SnapshotError
from futures.jobs.logs import LogPlan, Offsets, offsets_of

FORMAT_VERSION = 1
TIMERS_DIR = "timers"
MANIFEST_DIR = "manifest"

#: The pending timers. ``future`` is the normalised Future (id and due_ms set),
#: exactly what replay re-publishes; the rest are for filtering and people.
SNAPSHOT_SCHEMA = (
    "timer_id string, due_ms long, callback_topic string, topic string, partition int, offset long, "
    "idx int, timestamp_ms long, future binary, due_date string"
)
SNAPSHOT_COLUMNS = [c.split()[0] for c in SNAPSHOT_SCHEMA.split(", ")]
#: Snapshot columns whose values differ from timer to timer.
_UNIQUE_COLUMNS = ("timer_id", "due_ms", "offset", "timestamp_ms", "future")


@dataclass(frozen=True)
class Manifest:
    """What a snapshot covers. ``request_offsets``: {topic: {partition: [start, end)}}."""

    cluster_id: str
    bootstrap_servers: str
    request_topic: str
    events_topic: str
    partitions: int
    request_offsets: Offsets
    events_offsets: dict[int, tuple[int, int]]
    pending: int
    counts: dict[str, Any] = field(default_factory=dict)
    base: str | None = None
    created_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    format: int = FORMAT_VERSION

    @classmethod
    def of(
        cls,
        plan: LogPlan,
        bootstrap_servers: str,
        request_topic: str,
        events_topic: str,
        pending: int,
        counts: dict[str, Any],
        base: str | None,
    ) -> Manifest:
        events = offsets_of(plan.events).get(events_topic, {})
        return cls(
            cluster_id=plan.cluster_id,
            bootstrap_servers=bootstrap_servers,
            request_topic=request_topic,
            events_topic=events_topic,
            partitions=plan.partitions,
            request_offsets=offsets_of(plan.requests),
            events_offsets=events,
            pending=pending,
            counts=counts,
            base=base,
        )

    def request_ends(self) -> dict[str, dict[int, int]]:
        return {t: {p: end for p, (_, end) in parts.items()} for t, parts in self.request_offsets.items()}

    def events_ends(self) -> dict[int, int]:
        return {p: end for p, (_, end) in self.events_offsets.items()}

    def to_json(self) -> str:
        data = asdict(self)
        data["request_offsets"] = {
            t: {str(p): list(r) for p, r in parts.items()} for t, parts in self.request_offsets.items()
        }
        data["events_offsets"] = {str(p): list(r) for p, r in self.events_offsets.items()}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT_VERSION:
                raise SnapshotError(
                    f"snapshot format {data.get('format')!r} is not {FORMAT_VERSION}: "
                    "it was written by another version of kafka-timers"
                )
            data["request_offsets"] = {
                t: {int(p): (int(r[0]), int(r[1])) for p, r in parts.items()}
                for t, parts in data["request_offsets"].items()
            }
            data["events_offsets"] = {
                int(p): (int(r[0]), int(r[1])) for p, r in data["events_offsets"].items()
            }
            return cls(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"unreadable snapshot manifest: {exc}") from exc


def with_due_date(pending: DataFrame) -> DataFrame:
    """The snapshot columns, ``due_date`` (the UTC day, a directory ``due_date=yyyy-MM-dd``) of ``due_ms``."""
    # A date, not its text: a writer that meets more due dates than it keeps files open for
    # (session.CONCURRENT_WRITERS) sorts the rest of its timers by it, and a date sorts as one
    # integer where "2026-11-23" shares its first eight bytes with every other day of the month.
    dated = pending.withColumn("due_date", F.to_date(F.timestamp_millis(F.col("due_ms"))))
    return dated.select(*SNAPSHOT_COLUMNS)


def write(pending: DataFrame, manifest: Manifest, path: str, overwrite: bool = False) -> None:
    """Write the timers, then the manifest (its presence marks the snapshot complete)."""
    write_timers(pending, path, overwrite)
    write_manifest(pending.sparkSession, manifest, path)


def write_timers(pending: DataFrame, path: str, overwrite: bool = False) -> None:
    """The timers of a snapshot, without its manifest: :func:`write_manifest` must follow."""
    mode = "overwrite" if overwrite else "errorifexists"
    try:
        # Written by the tasks that classified the timers, a file per due date each: gathering a day
        # into one task would shuffle every pending timer once more and write a busy day alone.
        writer = with_due_date(pending).write.mode(mode).partitionBy("due_date")
        for column in _UNIQUE_COLUMNS:
            # Parquet tries a dictionary for every column until it outgrows a page; for a column
            # whose values (nearly) never repeat that is a hash lookup a value, for nothing.
            writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
        # Min/max statistics of the serialized Futures compare a whole Future a timer and serve no
        # filter: nobody selects timers by the bytes of their Future.
        writer = writer.option("parquet.column.statistics.enabled#future", "false")
        writer.parquet(f"{path}/{TIMERS_DIR}")
    except AnalysisException as exc:
        if "already exists" in str(exc).lower() or "PATH_ALREADY_EXISTS" in str(exc):
            raise SnapshotError(
                f"{path} already holds a snapshot: choose another --out, or --overwrite"
            ) from exc
        raise


def write_manifest(spark: SparkSession, manifest: Manifest, path: str) -> None:
    """The manifest, last: it marks the snapshot at ``path`` complete."""
    (
        spark.createDataFrame([(manifest.to_json(),)], "value string")
        .coalesce(1)
        .write.mode("overwrite")
        .text(f"{path}/{MANIFEST_DIR}")
    )


def exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a complete snapshot."""
    try:
        read_manifest(spark, path)
    except SnapshotError:
        return False
    return True


def _path_exists(spark: SparkSession, path: str) -> bool:
    """Through Hadoop's file system, as Spark sees paths (local, HDFS, S3...).

    Asking Spark to read a missing path logs a warning with a Java stack trace.
    """
    context = spark.sparkContext
    jvm = context._jvm
    if jvm is None:  # not a classic session: let the read below fail instead
        return True
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return bool(hadoop_path.getFileSystem(context._jsc.hadoopConfiguration()).exists(hadoop_path))


def read_manifest(spark: SparkSession, path: str) -> Manifest:
    if not _path_exists(spark, path):
        raise SnapshotError(
            f"there is no snapshot at {path}: the path does not exist. Check it (a snapshot is the "
            "--out directory of a timers-compact run)"
        )
    if not _path_exists(spark, f"{path}/{MANIFEST_DIR}"):
        raise SnapshotError(
            f"{path} has no snapshot manifest: it is not a snapshot, or the compaction that wrote it "
            "did not finish (compact again)"
        )
    try:
        rows = spark.read.text(f"{path}/{MANIFEST_DIR}").collect()
    except AnalysisException as exc:
        raise SnapshotError(
            f"{path} has no snapshot manifest: it is not a snapshot, or the compaction that wrote it "
            "did not finish (compact again)"
        ) from exc
    if len(rows) != 1:
        raise SnapshotError(f"{path}/{MANIFEST_DIR} should hold one line, found {len(rows)}")
    return Manifest.from_json(rows[0]["value"])


def read(spark: SparkSession, path: str) -> tuple[Manifest, DataFrame]:
    """The manifest and the pending timers (:data:`SNAPSHOT_SCHEMA`) of a complete snapshot."""
    manifest = read_manifest(spark, path)
    timers = spark.read.schema(SNAPSHOT_SCHEMA).parquet(f"{path}/{TIMERS_DIR}")
    return manifest, timers.select(*SNAPSHOT_COLUMNS)


def check_target(manifest: Manifest, cluster_id: str, partitions: int, what: str, force: bool) -> list[str]:
    """Problems with using the snapshot on a topic of ``cluster_id`` with ``partitions``.

    Raises :class:`SnapshotError` naming each problem unless ``force``; returns them
    (for a warning) when forced.
    """
    problems = []
    if manifest.cluster_id != cluster_id:
        problems.append(
            f"it was taken on cluster {manifest.cluster_id!r}, {what} is on cluster {cluster_id!r}"
        )
    if manifest.partitions != partitions:
        problems.append(
            f"it covers {manifest.partitions} partitions of {manifest.request_topic!r}, "
            f"{what} has {partitions}"
        )
    if problems and not force:
        raise SnapshotError(
            "snapshot does not match the target: "
            + "; ".join(problems)
            + ". To move timers to another cluster or partition count on purpose, pass --force "
            "(timers are then re-partitioned by id, as the client would)."
        )
    return problems
