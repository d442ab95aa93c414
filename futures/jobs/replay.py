"""``timers-replay``: put timers back on `timer-request`, or re-send their callbacks.

From a snapshot (``--snapshot``) or straight from the log (``--from-log``):

* default — re-publish the pending timers to `timer-request` (``TIMERS_TOPIC_REQUEST``),
  keyed by timer id. The worker replaces a pending timer when a request with
  its id reaches it, so replaying twice schedules (and fires) once. Rebuilds a
  worker's state after losing it, or fills a new topic set or cluster.
* ``--to-topic T --due-from A --due-to B`` — send the callbacks addressed to
  topic T of the timers due in [A, B) directly, with the headers the worker
  would set. From the log that is every callback due in the window that fired
  or is still pending; from a snapshot, the pending ones. For "replay
  everything due between 09:00 and 09:30 to orders-retry" after an outage.
  A timer never fires early, so B may not be after now: a window reaching into
  the future is refused (pending timers fire on their own, or are re-published
  to `timer-request` for the worker to fire on time).

``--dry-run`` prints what would be written and writes nothing. A snapshot whose
manifest names another cluster or partition count is refused unless ``--force``
(then timers are partitioned by id, as the client would).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from futures.jobs import compact, snapshot
from futures.jobs.config import JobConfig
from futures.jobs.logs import describe, plan_log, read_events, read_requests
from futures.jobs.occurrences import fired_or_pending
from futures.jobs.offsets import OffsetPlanner
from futures.jobs.outputs import callback_records, request_records, write_records
from futures.jobs.runner import (
    INSTANT_ARG_HELP,
    UsageError,
    add_spark_arguments,
    instant_ms,
    job_parser,
    run_main,
    spark_for,
    step,
)
from futures.jobs.snapshot import Manifest
from futures.jobs.versions import PENDING

log = logging.getLogger("futures.jobs.replay")

PROG = "timers-replay"


@dataclass(frozen=True)
class ReplayOptions:
    snapshot: str | None = None  # else: from the log
    due_from_ms: int | None = None  # inclusive, epoch ms
    due_to_ms: int | None = None  # exclusive, epoch ms
    to_topic: str | None = None  # send callbacks to this topic instead of re-publishing requests
    dry_run: bool = False
    force: bool = False
    max_records_per_split: int = 0

    def validate(self, now_ms: int | None = None) -> None:
        """Refuse what cannot be meant; ``now_ms`` (epoch ms) defaults to the clock."""
        if self.to_topic and (self.due_from_ms is None or self.due_to_ms is None):
            raise UsageError("--to-topic re-sends callbacks of a due window: give --due-from and --due-to")
        if self.due_from_ms is not None and self.due_to_ms is not None and self.due_from_ms >= self.due_to_ms:
            raise UsageError("--due-from must be before --due-to")
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if self.to_topic and self.due_to_ms is not None and self.due_to_ms > now:
            # Sending now the callback of a timer due later would fire it early: never.
            raise UsageError(
                f"--due-to {_iso(self.due_to_ms)} is in the future, and a timer never fires early: "
                "re-sending the callbacks of timers not yet due would. Re-send up to now at most "
                "(--due-to now). Pending timers fire on their own when due; if the worker lost them, "
                "re-publish them to timer-request (the same command without --to-topic) and it fires "
                "them on time"
            )


@dataclass
class Extracted:
    timers: DataFrame  # snapshot columns and `status`
    source: str  # for people: the snapshot path, or what the log plan covers
    manifest: Manifest | None = None


@dataclass(frozen=True)
class ReplayResult:
    records: int
    target: str  # the topic written to (or that would be, in a dry run)
    keep_partitions: bool
    dry_run: bool
    summary: tuple[str, ...] = ()


# -- extract -----------------------------------------------------------------


def extract(spark: SparkSession, config: JobConfig, options: ReplayOptions) -> Extracted:
    """The timers to choose from: a snapshot's pending set, or every version in the log."""
    if options.snapshot:
        manifest, timers = snapshot.read(spark, options.snapshot)
        unchecked = int(manifest.counts.get("unchecked") or 0)
        if unchecked:
            log.warning("%s was written with --accept-event-loss: %d of its pending timers may have fired "
                        "already (their FIRED event was gone), and fire again if replayed",
                        options.snapshot, unchecked)  # fmt: skip
        return Extracted(timers.withColumn("status", F.lit(PENDING)), options.snapshot, manifest)
    plan, _ = plan_log(config.common)
    split = options.max_records_per_split
    requests = read_requests(spark, config.common, plan.requests, config.parse_limits(), split)
    events = read_events(spark, config.common, plan.events, split)
    topics = len(config.common.topics.ingress_formats)
    classified = compact.compaction(requests, events, topics).classified
    return Extracted(fired_or_pending(classified), describe(plan))


# -- transform ---------------------------------------------------------------


def select(timers: DataFrame, options: ReplayOptions) -> DataFrame:
    """The timers to replay: pending ones re-published; fired or pending ones re-sent in a window."""
    chosen = timers
    if not options.to_topic:
        # Re-publishing a fired timer would fire it again: only pending ones go back.
        chosen = chosen.filter(F.col("status") == PENDING)
    else:
        chosen = chosen.filter(F.col("callback_topic") == options.to_topic)
    if options.due_from_ms is not None:
        chosen = chosen.filter(F.col("due_ms") >= options.due_from_ms)
    if options.due_to_ms is not None:
        chosen = chosen.filter(F.col("due_ms") < options.due_to_ms)
    return chosen


@dataclass
class Replay:
    chosen: DataFrame  # the timers (snapshot columns and `status`)
    records: DataFrame  # what to write (writer shape): requests, or callbacks


def transform(timers: DataFrame, options: ReplayOptions, request_topic: str, keep_partitions: bool) -> Replay:
    """The timers chosen and their records: requests for ``request_topic``, or their callbacks."""
    chosen = select(timers, options)
    if options.to_topic:
        return Replay(chosen, callback_records(chosen))
    return Replay(chosen, request_records(chosen, request_topic, keep_partitions))


# -- load --------------------------------------------------------------------


def target_layout(config: JobConfig, extracted: Extracted, options: ReplayOptions) -> bool:
    """Whether timers keep their partitions; refuses a mismatched snapshot unless forced."""
    if options.to_topic or extracted.manifest is None:
        return True  # callbacks are partitioned by their key; the log is this cluster's own
    topic = config.common.topics.request
    with OffsetPlanner(config.common.kafka.librdkafka()) as planner:
        cluster_id = planner.cluster_id()
        partitions = len(planner.partitions(topic))
    problems = snapshot.check_target(
        extracted.manifest, cluster_id, partitions, f"topic {topic!r}", options.force
    )
    for problem in problems:
        log.warning("forced: %s", problem)
    return not problems


def load(replay: Replay, config: JobConfig, options: ReplayOptions, keep_partitions: bool) -> ReplayResult:
    target = options.to_topic or config.common.topics.request
    # Summary, count and write are three actions over the same rows: read Kafka once.
    chosen = replay.chosen.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with step("selecting timers"):
            summary = summarize(chosen)
            total = int(chosen.count())
        if options.dry_run:
            return ReplayResult(total, target, keep_partitions, True, summary)
        with step(f"writing {total:,} records to {target}"):
            write_records(replay.records, config.common)
    finally:
        chosen.unpersist()
    return ReplayResult(total, target, keep_partitions, False, summary)


def summarize(chosen: DataFrame, sample: int = 5) -> tuple[str, ...]:
    """Per callback topic: how many, first and last due time; then a few examples."""
    lines = []
    rows = (
        chosen.groupBy("callback_topic")
        .agg(F.count(F.lit(1)).alias("n"), F.min("due_ms").alias("first"), F.max("due_ms").alias("last"))
        .orderBy("callback_topic")
        .collect()
    )
    for row in rows:
        first, last = _iso(row["first"]), _iso(row["last"])
        lines.append(f"{row['n']:>10,}  to {row['callback_topic']}, due {first} .. {last}")
    for row in (
        chosen.select("timer_id", "due_ms", "callback_topic", "status")
        .orderBy("due_ms")
        .limit(sample)
        .collect()
    ):
        due = _iso(row["due_ms"])
        lines.append(f"    e.g. {row['timer_id']} due {due} ({row['status']}) -> {row['callback_topic']}")
    return tuple(lines)


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- main --------------------------------------------------------------------


def run(spark: SparkSession, config: JobConfig, options: ReplayOptions) -> ReplayResult:
    options.validate()
    with step("planning"):
        extracted = extract(spark, config, options)
        keep = target_layout(config, extracted, options)
    log.info("replaying from %s", extracted.source)
    replay = transform(extracted.timers, options, config.common.topics.request, keep)
    return load(replay, config, options, keep)


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser(
        PROG, "Re-publish pending timers to timer-request, or re-send callbacks due in a window."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--snapshot", metavar="PATH", help="replay the pending timers of this snapshot")
    source.add_argument("--from-log", action="store_true", help="compute the timers from the log itself")
    parser.add_argument(
        "--due-from", type=instant_ms, metavar="TIME", help=f"only timers due at or after: {INSTANT_ARG_HELP}"
    )
    parser.add_argument(
        "--due-to", type=instant_ms, metavar="TIME", help="only timers due before this time (or now)"
    )
    parser.add_argument(
        "--to-topic",
        metavar="TOPIC",
        help="re-send the callbacks addressed to TOPIC due in --due-from..--due-to, instead of "
        "re-publishing; --due-to may not be after now (a timer never fires early)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    parser.add_argument(
        "--force", action="store_true", help="replay a snapshot into another cluster or partition count"
    )
    add_spark_arguments(parser)
    return parser


def _job(args: argparse.Namespace) -> int:
    options = ReplayOptions(
        snapshot=args.snapshot,
        due_from_ms=args.due_from,
        due_to_ms=args.due_to,
        to_topic=args.to_topic,
        dry_run=args.dry_run,
        force=args.force,
        max_records_per_split=args.max_records_per_split,
    )
    options.validate()
    config = JobConfig.from_env()
    spark = spark_for(args, PROG)
    try:
        result = run(spark, config, options)
    finally:
        spark.stop()
    print_result(result)
    return 0


def print_result(result: ReplayResult) -> None:
    verb = "would write" if result.dry_run else "wrote"
    layout = "" if result.keep_partitions else " (partitioned by timer id)"
    print(f"{verb} {result.records:,} records to {result.target}{layout}")
    for line in result.summary:
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``timers-replay``."""
    return run_main(PROG, build_parser(), _job, argv)


if __name__ == "__main__":
    raise SystemExit(main())
