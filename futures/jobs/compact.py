"""``timers-compact``: the pending set of the request log, as a Parquet snapshot.

Kafka cannot compact `timer-request` (many timers share a key, and a fired
timer must disappear), so it grows forever. This job reads it (and any extra
ingress topics) with `timer-events`, keeps the latest version of every timer
minus those fired, cancelled or rejected (:mod:`futures.jobs.versions`), and
writes them with a manifest of the offsets covered (:mod:`futures.jobs.snapshot`).

* ``--base SNAPSHOT`` reads only what the log gained since that snapshot, and
  the snapshot's pending set: the way to compact a log that was truncated.
* ``--publish TOPIC`` also writes the pending set to a fresh topic (a new
  generation of `timer-request`, for a new worker group or cluster).
* ``--truncate`` deletes request records below the compacted offsets, never
  beyond what the worker group has consumed. Off by default.

A snapshot is only as good as `timer-events`: a fired timer whose FIRED event
was deleted looks pending. Compaction refuses when that may have happened to a
timer it keeps (:mod:`futures.jobs.retention`), unless ``--accept-event-loss``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from futures.ingress.limits import ParseLimits
from futures.jobs import snapshot
from futures.jobs.config import JobConfig
from futures.jobs.decode import SCHEDULE
from futures.jobs.errors import JobError, SnapshotError
from futures.jobs.logs import (
    LogPlan,
    decode_event_rows,
    decode_requests,
    describe,
    plan_log,
    read_events,
    read_requests,
)
from futures.jobs.occurrences import pending_timers
from futures.jobs.offsets import consumer_config
from futures.jobs.outputs import create_fresh_topic, request_records, write_records
from futures.jobs.retention import EventLoss, EventsLog, KafkaEventsLog, check_events
from futures.jobs.runner import add_spark_arguments, job_parser, run_main, spark_for, step
from futures.jobs.snapshot import SNAPSHOT_COLUMNS, Manifest
from futures.jobs.versions import (
    ORIGIN_BASE,
    PENDING,
    Counts,
    classify,
    count,
    count_columns,
    count_events,
    counts_of,
    event_count_columns,
    events_of,
)

log = logging.getLogger("futures.jobs.compact")

PROG = "timers-compact"


@dataclass(frozen=True)
class CompactOptions:
    out: str
    base: str | None = None
    publish: str | None = None
    truncate: bool = False
    force: bool = False
    overwrite: bool = False
    accept_event_loss: bool = False  # write the snapshot even if FIRED events may be gone
    max_records_per_split: int = 0


@dataclass
class Extracted:
    plan: LogPlan
    requests: DataFrame  # request rows of every request topic (decode.REQUEST_SCHEMA, origin)
    events: DataFrame  # event rows of `timer-events` (decode.EVENT_SCHEMA)
    topics: int  # how many request topics
    base: DataFrame | None = None  # the base snapshot's pending timers
    base_manifest: Manifest | None = None
    event_loss: EventLoss | None = None  # events the classification needs that may be gone


@dataclass
class Compaction:
    classified: DataFrame  # every request row with its status (versions.classify)
    events: DataFrame  # decoded events
    pending: DataFrame  # the pending timers, snapshot columns
    #: Counts the events as the classification reads them (versions.event_count_columns): ready
    #: after the first action on ``classified``.
    events_seen: Observation | None = None


@dataclass(frozen=True)
class CompactResult:
    manifest: Manifest
    counts: Counts
    seconds: float
    published: int = 0
    truncated: tuple[tuple[str, int, int], ...] = ()  # (topic, partition, deleted below offset)
    event_loss: EventLoss | None = None
    unchecked: int = 0  # pending timers due before event_loss.horizon_ms: they may have fired


# -- extract -----------------------------------------------------------------


def extract(
    spark: SparkSession, config: JobConfig, options: CompactOptions, events_log: EventsLog | None = None
) -> Extracted:
    """Pin the offsets to read (after the base snapshot's, if any) and open the logs.

    ``events_log`` answers the check of `timer-events` (default: the cluster itself).
    """
    common = config.common
    base_manifest = base = None
    if options.base:
        base_manifest, base = snapshot.read(spark, options.base)
    plan, marks = plan_log(
        common,
        base_manifest.request_ends() if base_manifest else None,
        base_manifest.events_ends() if base_manifest else None,
    )
    _check_coverage(plan, marks, base_manifest, config, options.force)
    events_topic = common.topics.events
    event_loss = check_events(
        events_log or KafkaEventsLog(common.kafka.librdkafka()),
        events_topic,
        marks[events_topic],
        base_manifest.events_ends() if base_manifest else {},
        time.time_ns() // 1_000_000,
    )
    split = options.max_records_per_split
    return Extracted(
        plan=plan,
        requests=read_requests(spark, common, plan.requests, config.parse_limits(), split),
        events=read_events(spark, common, plan.events, split),
        topics=len(common.topics.ingress_formats),
        base=base,
        base_manifest=base_manifest,
        event_loss=event_loss,
    )


def _check_coverage(
    plan: LogPlan,
    marks: dict[str, dict[int, tuple[int, int]]],
    base: Manifest | None,
    config: JobConfig,
    force: bool,
) -> None:
    """Refuse to write a snapshot that would silently miss timers (unless ``force``)."""
    problems = []
    if base is not None:
        request_topic = config.common.topics.request
        if base.request_topic != request_topic:
            problems.append(f"the base snapshot is of topic {base.request_topic!r}, not {request_topic!r}")
        problems += snapshot.check_target(base, plan.cluster_id, plan.partitions, "the log", force=True)
        ends = base.request_ends()
        for r in plan.requests:
            covered = ends.get(r.topic, {}).get(r.partition, 0)
            low = marks[r.topic][r.partition][0]
            if low > covered:
                problems.append(
                    f"{r.topic}[{r.partition}] records {covered}..{low - 1} were deleted "
                    "after the base snapshot"
                )
    else:
        for r in plan.requests:
            low = marks[r.topic][r.partition][0]
            if low > 0:
                problems.append(
                    f"{r.topic}[{r.partition}] starts at offset {low}: the records below were deleted "
                    "(retention or --truncate), and the timers they held are only in the last snapshot"
                )
    if not problems:
        return
    if force:
        for problem in problems:
            log.warning("forced: %s", problem)
        return
    hint = "" if base is not None else " Compact with --base <the last snapshot>, or"
    raise SnapshotError("; ".join(problems) + f".{hint} pass --force to compact what the log holds anyway.")


# -- transform ---------------------------------------------------------------


def base_requests(base: DataFrame) -> DataFrame:
    """A snapshot's pending timers as request rows (origin ``base``), to classify with the new log."""
    return base.select(
        "topic", "partition", "offset", "idx", "timestamp_ms",
        F.lit(SCHEDULE).alias("kind"),
        "timer_id", "due_ms", "callback_topic", "future",
        F.lit(None).cast("string").alias("reason"),
        F.lit(ORIGIN_BASE).alias("origin"),
    )  # fmt: skip


def transform(
    requests: DataFrame, events: DataFrame, limits: ParseLimits, base: DataFrame | None = None
) -> Compaction:
    """Raw Kafka rows of the request topics and of `timer-events` (and a base snapshot's timers)
    → classified rows and the pending set: :func:`compaction` of the rows they decode to."""
    topics = len(limits.topics.ingress_formats)
    return compaction(decode_requests(requests, limits), decode_event_rows(events), topics, base)


def compaction(
    requests: DataFrame, events: DataFrame, topics: int = 1, base: DataFrame | None = None
) -> Compaction:
    """Request and event rows (as :mod:`futures.jobs.logs` reads them; ``topics``: how many request
    topics) and a base snapshot's timers → classified rows and the pending set.

    Pure: DataFrames in, DataFrames out; nothing is computed until an action.
    """
    if base is not None:
        requests = requests.unionByName(base_requests(base))
    events_seen = Observation()  # a name of its own: a base may be a compaction too
    classified = classify(requests, events.observe(events_seen, *event_count_columns()), topics)
    return Compaction(classified, events, pending_timers(classified), events_seen)


# -- load --------------------------------------------------------------------


def load(
    compaction: Compaction, extracted: Extracted, config: JobConfig, options: CompactOptions
) -> CompactResult:
    """Count, write the snapshot, then publish and truncate if asked."""
    started = time.monotonic()
    common = config.common
    # The requests and the events are read once, by the pass that writes the snapshot, and counted
    # on the way (DataFrame.observe); only a possible event loss takes a pass of its own, before
    # writing (the events are then counted in that pass: the first action fills an Observation).
    unchecked = 0
    if extracted.event_loss is not None:
        with step("counting the pending timers whose FIRED event may be gone"):
            unchecked = count_unchecked(compaction.classified, extracted.event_loss)
        check_event_loss(extracted.event_loss, unchecked, options.accept_event_loss)
    observation = Observation("compaction")
    observed = compaction.classified.observe(observation, *count_columns())
    pending = pending_timers(observed)
    with step(f"reading, classifying and writing the pending timers of {describe(extracted.plan)}"):
        snapshot.write_timers(pending, options.out, options.overwrite)
    events_counts = events_seen(compaction)
    if events_counts is None:
        with step(f"counting {extracted.plan.event_records:,} events"):
            events_counts = count_events(compaction.events)
    counts = counts_of(observation.get, events_counts)
    if counts is None:  # an invalid record with a reason of its own: count them one by one
        with step("counting the invalid records by reason"):
            counts = count(compaction.classified, compaction.events)
    manifest = Manifest.of(
        extracted.plan,
        common.kafka.bootstrap_servers,
        common.topics.request,
        common.topics.events,
        counts.pending,
        {**counts.as_dict(), "unchecked": unchecked},
        options.base,
    )
    snapshot.write_manifest(compaction.classified.sparkSession, manifest, options.out)
    published = 0
    if options.publish:
        with step(f"publishing {counts.pending:,} pending timers to {options.publish}"):
            # From the snapshot just written, not the log: nothing is read or classified again.
            _, written = snapshot.read(compaction.classified.sparkSession, options.out)
            timers = written.select(*SNAPSHOT_COLUMNS[:-1])
            write_records(request_records(timers, options.publish, keep_partitions=True), common)
            published = counts.pending
    truncated: tuple[tuple[str, int, int], ...] = ()
    if options.truncate:
        with step("truncating the request topics below the compacted offsets"):
            truncated = truncate(config, extracted.plan)
    return CompactResult(
        manifest, counts, time.monotonic() - started, published, truncated, extracted.event_loss, unchecked
    )


def events_seen(compaction: Compaction) -> tuple[int, int] | None:
    """(events read, undecodable) as the classification counted them, after an action on it; None
    when it holds no counts: Spark dropped the events from the plan it ran (when one side of the
    join is known to be empty), and only a pass of their own can count them."""
    if compaction.events_seen is None:
        return None
    try:
        metrics = compaction.events_seen.get
    except Exception:  # noqa: BLE001 - Py4JJavaError (an assertion on the empty metrics row)
        return None
    return events_of(metrics) if set(metrics) >= {"events:read", "events:bad"} else None


def count_unchecked(classified: DataFrame, loss: EventLoss | None) -> int:
    """Pending timers due at or before the horizon of ``loss``: their FIRED event may be gone.

    A timer never fires early, so one due after the horizon cannot have fired unseen.
    """
    if loss is None:
        return 0
    return int(classified.filter((F.col("status") == PENDING) & (F.col("due_ms") <= loss.horizon_ms)).count())


def check_event_loss(loss: EventLoss | None, unchecked: int, accept: bool) -> None:
    """Refuse a snapshot that may keep fired timers as pending, unless ``accept``."""
    if loss is None:
        return
    due = datetime.fromtimestamp(loss.horizon_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    why = "; ".join(loss.reasons)
    if not unchecked:
        log.info("%s; no pending timer was due before %s, so none can have fired unseen", why, due)
        return
    timers = f"{unchecked:,} pending timer{'s' if unchecked != 1 else ''}"
    if accept:
        log.warning("--accept-event-loss: %s due before %s may have fired already (%s); "
                    "replaying this snapshot fires them again", timers, due, why)  # fmt: skip
        return
    raise SnapshotError(
        f"FIRED events this compaction needs may be gone: {why}. {timers} due before {due} may have "
        "fired already, and replaying the snapshot would fire them again. Keep timer-events at least "
        "as long as the requests you compact (retention.ms=-1, cleanup.policy=delete), or compact "
        "with --base more often than its retention; or pass --accept-event-loss to write the "
        "snapshot anyway, with them as pending."
    )


def truncate(config: JobConfig, plan: LogPlan) -> tuple[tuple[str, int, int], ...]:
    """Delete request records below the snapshot's end, and below what the worker group consumed."""
    kafka = config.common.kafka.librdkafka()
    consumer = Consumer({**consumer_config(kafka), "group.id": config.app_id})
    try:
        committed = consumer.committed(
            [TopicPartition(r.topic, r.partition) for r in plan.requests], timeout=15
        )
    finally:
        consumer.close()
    consumed = {(tp.topic, tp.partition): tp.offset for tp in committed}
    targets = []
    for r in plan.requests:
        upto = min(r.end, consumed.get((r.topic, r.partition), -1))
        if upto > r.start:
            targets.append(TopicPartition(r.topic, r.partition, upto))
        else:
            log.info("%s[%d]: nothing to delete (worker group %s consumed up to %s)",
                     r.topic, r.partition, config.app_id, consumed.get((r.topic, r.partition)))  # fmt: skip
    if not targets:
        return ()
    admin = AdminClient(kafka)
    done = []
    try:
        for tp, future in admin.delete_records(targets, request_timeout=30).items():
            result = future.result()
            done.append((tp.topic, tp.partition, int(getattr(result, "low_watermark", tp.offset))))
    except KafkaException as exc:
        raise JobError(
            f"the broker refused DeleteRecords ({exc}); nothing more was deleted. The snapshot is complete. "
            "The embedded Tansu broker does not implement DeleteRecords; on Kafka, the job needs the "
            "DELETE permission on the request topics."
        ) from exc
    return tuple(done)


# -- main --------------------------------------------------------------------


def run(spark: SparkSession, config: JobConfig, options: CompactOptions) -> CompactResult:
    started = time.monotonic()
    # Refuse what would fail at the end before reading anything.
    if not options.overwrite and snapshot.exists(spark, options.out):
        raise SnapshotError(f"{options.out} already holds a snapshot: choose another --out, or --overwrite")
    extracted = extract(spark, config, options)
    if options.publish:
        create_fresh_topic(config.common, options.publish, extracted.plan.partitions)
    compacted = compaction(extracted.requests, extracted.events, extracted.topics, extracted.base)
    result = load(compacted, extracted, config, options)
    return replace(result, seconds=time.monotonic() - started)


def default_out(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"snapshots/{stamp}"


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser(PROG, "Compact the timer-request log into a Parquet snapshot of the pending timers.")
    parser.add_argument("--out", help="snapshot directory (default: snapshots/<UTC time>)")
    parser.add_argument(
        "--base", metavar="SNAPSHOT", help="start from this snapshot; read only newer records"
    )
    parser.add_argument("--publish", metavar="TOPIC", help="also write the pending set to this fresh topic")
    parser.add_argument(
        "--truncate",
        action="store_true",
        help="delete request records below the compacted offsets (and below the worker group's "
        "committed offsets); keep the snapshot, the next compaction needs it as --base",
    )
    parser.add_argument("--force", action="store_true", help="go on despite a coverage or manifest mismatch")
    parser.add_argument(
        "--accept-event-loss",
        action="store_true",
        help="write the snapshot even though FIRED events may have left timer-events (retention): "
        "the timers they fired then stay pending, and are counted",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing snapshot at --out")
    add_spark_arguments(parser)
    return parser


def _job(args: argparse.Namespace) -> int:
    config = JobConfig.from_env()
    options = CompactOptions(
        out=args.out or default_out(),
        base=args.base,
        publish=args.publish,
        truncate=args.truncate,
        force=args.force,
        overwrite=args.overwrite,
        accept_event_loss=args.accept_event_loss,
        max_records_per_split=args.max_records_per_split,
    )
    spark = spark_for(args, PROG)
    try:
        result = run(spark, config, options)
    finally:
        spark.stop()
    print_result(result, options)
    return 0


def print_result(result: CompactResult, options: CompactOptions) -> None:
    for line in result.counts.lines():
        print(line)
    rate = result.counts.read / result.seconds if result.seconds > 0 else 0.0
    if result.unchecked:
        print(f"unchecked   {result.unchecked:>12,}  pending, but their FIRED event may be gone: "
              "a replay may fire them again")  # fmt: skip
    print(f"snapshot    {options.out} ({result.counts.pending:,} pending timers)")
    print(f"took        {result.seconds:.1f}s ({rate:,.0f} request rows/s)")
    if result.published:
        print(f"published   {result.published:,} timers to {options.publish}")
    if options.truncate and not result.truncated:
        print("truncated   nothing: the worker group has not consumed past the snapshot's start")
    for topic, partition, offset in result.truncated:
        print(f"truncated   {topic}[{partition}] below offset {offset}")
    if result.truncated:
        print(f"keep {options.out}: it is the only copy of the pending timers below those offsets "
              "(compact next time with --base)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``timers-compact``."""
    return run_main(PROG, build_parser(), _job, argv)


if __name__ == "__main__":
    raise SystemExit(main())
