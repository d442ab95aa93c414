"""What became of every timer version in the request log: the heart of compaction.

A *version* is one accepted schedule (one request) of a timer id. The worker
keeps one table per partition, so a timer is (partition, id), and within it the
latest request wins. Each version ends in exactly one status:

* ``fired``      — a FIRED event on `timer-events` names this version
  (partition, id and the request's offset). Checked first: a version that
  fired stays fired even if a later request named the same id.
* ``rejected``   — a REJECTED event names it (by offset; a too-late drop that
  carries no offset, by due time): the worker refused it or its callback.
* ``cancelled``  — the next request for the id is a cancel.
* ``superseded`` — the next request for the id is a newer schedule.
* ``pending``    — none of the above: the worker holds it, or will once it
  reads the request. The pending set is what a snapshot keeps.

Order within (partition, id) is the log order. Records of one topic are ordered
by offset; when extra ingress topics feed the same partition, records of
different topics are ordered by their timestamps (made monotonic per topic
partition, so a topic's own order is never changed) — the best a job can know of
the order the worker happened to read them in.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from futures.ingress.base import PARSE_REASONS
from futures.jobs.decode import CANCEL, EVENT_TOMBSTONE, SCHEDULE, TOMBSTONE, UNDECODABLE

PENDING = "pending"
FIRED = "fired"
REJECTED = "rejected"
CANCELLED = "cancelled"
SUPERSEDED = "superseded"
#: Status of rows that are no version: cancel requests and invalid records.
CANCEL_REQUEST = "cancel"
INVALID_RECORD = "invalid"

#: Where a row came from: the log read now, or the pending set of a base snapshot.
ORIGIN_LOG = "log"
ORIGIN_BASE = "base"


def _outcomes(events: DataFrame) -> DataFrame:
    """Per timer (partition, id): the request offsets FIRED and REJECTED name, and the due
    times of too-late drops (a timer dropped under TIMERS_LATE_POLICY=drop has no offset in its event).

    Keyed like the classification's window, so one shuffle of the request rows serves both.
    """
    kind, offset = F.col("kind"), F.col("source_offset")
    return (
        events.filter(kind.isin("FIRED", "REJECTED"))
        .groupBy("partition", "timer_id")
        .agg(
            F.collect_set(F.when((kind == "FIRED") & (offset >= 0), offset)).alias("fired_at"),
            F.collect_set(F.when((kind == "REJECTED") & (offset >= 0), offset)).alias("rejected_at"),
            F.collect_set(F.when((kind == "REJECTED") & (offset < 0), F.col("due_ms"))).alias("dropped_due"),
        )
    )


def _log_order(requests: DataFrame, topics: int) -> tuple[DataFrame, tuple[str, ...]]:
    """The rows and the columns that order them within a timer.

    With one request topic, offsets alone are the order. With more, ``seq_ms`` is added: the
    record time, never decreasing along a topic partition.
    """
    if topics <= 1:
        # No column of its own: 8 bytes a row less to shuffle and sort, and no string compared.
        return requests, ("offset", "idx")
    along = (
        Window.partitionBy("topic", "partition")
        .orderBy("offset", "idx")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    ordered = requests.withColumn("seq_ms", F.max(F.coalesce(F.col("timestamp_ms"), F.lit(-1))).over(along))
    return ordered, ("seq_ms", "topic", "offset", "idx")


def classify(requests: DataFrame, events: DataFrame, topics: int = 1) -> DataFrame:
    """Every request row with its ``status`` (module doc) and ``next_kind``.

    ``topics``: how many request topics the rows come from (`timer-request`
    and the extra ingress topics).

    ``requests``: :data:`~futures.jobs.decode.REQUEST_SCHEMA` rows plus ``origin``;
    ``events``: :data:`~futures.jobs.decode.EVENT_SCHEMA` rows.
    """
    # One pass over the rows (no union of filtered branches), so the decoding
    # upstream runs once. Invalid records form their own window partitions: a
    # rejected request never replaces a pending version.
    rows, order = _log_order(requests.withColumn("valid", F.col("kind").isin(SCHEDULE, CANCEL)), topics)
    by_timer = Window.partitionBy("timer_hash", "partition", "timer_id", "valid").orderBy(*order)
    # Joined on (partition, timer_id) before the window: the rows are shuffled once for both. A hash
    # join (the outcomes, a few per timer that fired or was refused, are the hashed side) keeps the
    # rows as they come; a sort-merge join would sort them once for itself and once for the window.
    outcomes = _outcomes(events).hint("shuffle_hash")
    # The window sorts the rows by its keys. Led by a hash of the timer, the sort decides nearly every
    # comparison on its 8-byte prefix; led by the partition (four values or so) it would compare
    # the timer ids themselves, as strings, every time. (Hashed after the join's shuffle: 8 random
    # bytes a row more to shuffle would cost more than they save.)
    joined = rows.join(outcomes, ["partition", "timer_id"], "left")
    versions = joined.withColumn("timer_hash", F.xxhash64("partition", "timer_id")).withColumn(
        "next_kind", F.lead("kind").over(by_timer)
    )

    def named(column: str, value: str) -> Column:
        return F.coalesce(F.array_contains(column, F.col(value)), F.lit(False))

    status: Column = (
        F.when(~F.col("valid"), F.lit(INVALID_RECORD))
        .when(F.col("kind") == CANCEL, F.lit(CANCEL_REQUEST))
        .when(named("fired_at", "offset"), F.lit(FIRED))
        .when(named("rejected_at", "offset") | named("dropped_due", "due_ms"), F.lit(REJECTED))
        .when(F.col("next_kind") == CANCEL, F.lit(CANCELLED))
        .when(F.col("next_kind").isNotNull(), F.lit(SUPERSEDED))
        .otherwise(F.lit(PENDING))
    )
    dropped = ("valid", "timer_hash", "fired_at", "rejected_at", "dropped_due", "seq_ms")
    return versions.withColumn("status", status).drop(*dropped)


@dataclass(frozen=True)
class Counts:
    """What a classification found, for people and the manifest."""

    read: int = 0  # records read from the log (a batch record counts once per timer it holds)
    base: int = 0  # pending timers taken from the base snapshot
    schedules: int = 0
    cancels: int = 0
    superseded: int = 0
    fired: int = 0
    cancelled: int = 0
    rejected: int = 0
    pending: int = 0
    invalid: tuple[tuple[str, int], ...] = ()  # (reason, count): undecodable, unknown-kind, tombstone...
    events_read: int = 0
    events_invalid: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "read": self.read,
            "base": self.base,
            "schedules": self.schedules,
            "cancels": self.cancels,
            "superseded": self.superseded,
            "fired": self.fired,
            "cancelled": self.cancelled,
            "rejected": self.rejected,
            "pending": self.pending,
            "invalid": dict(self.invalid),
            "events_read": self.events_read,
            "events_invalid": self.events_invalid,
        }

    def lines(self) -> list[str]:
        """Human-readable summary, one fact a line."""
        out = [
            f"read        {self.read:>12,}  request rows from the log"
            + (f" (+{self.base:,} pending from the base snapshot)" if self.base else ""),
            f"schedules   {self.schedules:>12,}",
            f"cancels     {self.cancels:>12,}",
            f"superseded  {self.superseded:>12,}  replaced by a newer request for the same id",
            f"fired       {self.fired:>12,}",
            f"cancelled   {self.cancelled:>12,}",
            f"rejected    {self.rejected:>12,}  refused by the worker (timer-events)",
            f"pending     {self.pending:>12,}",
            f"events      {self.events_read:>12,}  read from timer-events"
            + (f", {self.events_invalid:,} undecodable" if self.events_invalid else ""),
        ]
        for reason, n in self.invalid:
            out.append(f"invalid     {n:>12,}  {reason}")
        return out


_STATUSES = (PENDING, FIRED, REJECTED, CANCELLED, SUPERSEDED, CANCEL_REQUEST, INVALID_RECORD)
#: What an invalid row's reason can be: the parser's codes, the decoder's tombstone, and
#: ``unknown`` for none. Counted in the pass that writes the snapshot (:func:`count_columns`).
_REASONS = tuple(sorted(PARSE_REASONS | {"batch-invalid", TOMBSTONE, "unknown"}))
_OTHER_REASON = "reason:other"


def count_columns() -> list[Column]:
    """Aggregates of :func:`classify`'s rows that :func:`counts_of` turns into :class:`Counts`.

    For ``DataFrame.observe``: the rows are counted while the snapshot is written,
    in the same pass, instead of in one of their own.
    """
    reason = F.coalesce(F.col("reason"), F.lit("unknown"))
    invalid = F.col("status") == INVALID_RECORD
    return [
        F.count_if(F.col("origin") == ORIGIN_BASE).alias("origin:base"),
        F.count_if(F.col("origin") != ORIGIN_BASE).alias("origin:log"),
        *(F.count_if(F.col("status") == s).alias(f"status:{s}") for s in _STATUSES),
        *(F.count_if(invalid & (reason == r)).alias(f"reason:{r}") for r in _REASONS),
        F.count_if(invalid & ~reason.isin(*_REASONS)).alias(_OTHER_REASON),
    ]


def counts_of(metrics: dict[str, int], events: tuple[int, int]) -> Counts | None:
    """:class:`Counts` of the :func:`count_columns` ``metrics`` and ``events`` (read, undecodable).

    None when some invalid row has a reason :func:`count_columns` does not know: then only
    :func:`count` can tell them apart.
    """
    if metrics.get(_OTHER_REASON):
        return None
    by_status = {s: int(metrics.get(f"status:{s}", 0)) for s in _STATUSES}
    invalid = {r: int(metrics.get(f"reason:{r}", 0)) for r in _REASONS}
    versions = (PENDING, FIRED, REJECTED, CANCELLED, SUPERSEDED)
    return Counts(
        read=int(metrics.get("origin:log", 0)),
        base=int(metrics.get("origin:base", 0)),
        schedules=sum(by_status[s] for s in versions),
        cancels=by_status[CANCEL_REQUEST],
        superseded=by_status[SUPERSEDED],
        fired=by_status[FIRED],
        cancelled=by_status[CANCELLED],
        rejected=by_status[REJECTED],
        pending=by_status[PENDING],
        invalid=tuple(sorted((r, n) for r, n in invalid.items() if n)),
        events_read=events[0],
        events_invalid=events[1],
    )


def _bad_event() -> Column:
    return F.col("kind").isin(UNDECODABLE, EVENT_TOMBSTONE)


def event_count_columns() -> list[Column]:
    """Aggregates of decoded `timer-events` rows that :func:`events_of` turns into (read, undecodable).

    For ``DataFrame.observe`` on the events the classification reads: counted in its pass.
    """
    return [F.count(F.lit(1)).alias("events:read"), F.count_if(_bad_event()).alias("events:bad")]


def events_of(metrics: dict[str, int]) -> tuple[int, int]:
    """(events read, undecodable or tombstones) of the :func:`event_count_columns` ``metrics``."""
    return int(metrics.get("events:read", 0)), int(metrics.get("events:bad", 0))


def count_events(events: DataFrame) -> tuple[int, int]:
    """(events read, undecodable or tombstones) of decoded `timer-events` rows, in a pass of their own."""
    rows = events.groupBy(_bad_event().alias("bad")).count().collect()
    return sum(int(r["count"]) for r in rows), sum(int(r["count"]) for r in rows if r["bad"])


def count(classified: DataFrame, events: DataFrame) -> Counts:
    """Counts of ``classify``'s output (two small aggregations; the rows stay on the executors)."""
    rows = classified.groupBy("origin", "status", "reason").count().collect()
    by_status: dict[str, int] = {}
    invalid: dict[str, int] = {}
    read = base = 0
    for row in rows:
        n = int(row["count"])
        if row["origin"] == ORIGIN_BASE:
            base += n
        else:
            read += n
        by_status[row["status"]] = by_status.get(row["status"], 0) + n
        if row["status"] == INVALID_RECORD:
            invalid[row["reason"] or "unknown"] = invalid.get(row["reason"] or "unknown", 0) + n
    events_total, events_bad = count_events(events)
    versions = (PENDING, FIRED, REJECTED, CANCELLED, SUPERSEDED)
    return Counts(
        read=read,
        base=base,
        schedules=sum(by_status.get(s, 0) for s in versions),
        cancels=by_status.get(CANCEL_REQUEST, 0),
        superseded=by_status.get(SUPERSEDED, 0),
        fired=by_status.get(FIRED, 0),
        cancelled=by_status.get(CANCELLED, 0),
        rejected=by_status.get(REJECTED, 0),
        pending=by_status.get(PENDING, 0),
        invalid=tuple(sorted(invalid.items())),
        events_read=events_total,
        events_invalid=events_bad,
    )
