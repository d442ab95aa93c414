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

A recurring timer (a *series*) is one version whose occurrences each fire: every
FIRED event of the series names the request that started it. When one fires (or
its callback is dead-lettered) the worker arms the next, a SCHEDULED event with
its due time, that same offset and reason ``occurrence <ordinal>``. So a version
is a *running series* while the latest occurrence armed for it is due later than
every FIRED or REJECTED event naming it: it stays pending (or is cancelled or
superseded by the next request) as its latest armed occurrence — ``due_ms`` and
``ordinal`` say which — until its last occurrence fires and nothing is armed
after it. A series that never armed an occurrence is classified as any timer.

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


#: Reason of the SCHEDULED event of a series' next occurrence: its ordinal.
_ARMED_REASON = r"^occurrence ([0-9]{1,18})$"


def _outcomes(events: DataFrame) -> DataFrame:
    """Per timer (partition, id): the request offsets FIRED and REJECTED name, the due
    times of too-late drops (a timer dropped under TIMERS_LATE_POLICY=drop has no offset in its
    event), and for a series the occurrences armed and landed (:func:`_series_events`).

    Keyed like the classification's window, so one shuffle of the request rows serves both.
    """
    kind, offset = F.col("kind"), F.col("source_offset")
    armed = (kind == "SCHEDULED") & F.col("reason").startswith("occurrence ")
    return (
        events.filter(kind.isin("FIRED", "REJECTED") | armed)
        .groupBy("partition", "timer_id")
        .agg(
            F.collect_set(F.when((kind == "FIRED") & (offset >= 0), offset)).alias("fired_at"),
            F.collect_set(F.when((kind == "REJECTED") & (offset >= 0), offset)).alias("rejected_at"),
            F.collect_set(F.when((kind == "REJECTED") & (offset < 0), F.col("due_ms"))).alias("dropped_due"),
            _series_events().alias("series"),
        )
        # Only a timer that armed an occurrence is a series that went on: for any other, the
        # offsets above say all, and the rows carry no list through the window's sort.
        .withColumn("series", F.when(F.exists("series", lambda e: e["ordinal"].isNotNull()), F.col("series")))
    )


def _series_events() -> Column:
    """Aggregate: (offset, due_ms, ordinal, fired) of each FIRED or REJECTED event that names an
    offset, and of each SCHEDULED event arming a series' next occurrence (ordinal set)."""
    kind, offset = F.col("kind"), F.col("source_offset")
    number = F.regexp_extract(F.col("reason"), _ARMED_REASON, 1)
    armed = (kind == "SCHEDULED") & (number != "")
    event = F.struct(
        offset.alias("offset"),
        F.col("due_ms").alias("due_ms"),
        F.when(armed, number.cast("long")).alias("ordinal"),
        (kind == "FIRED").alias("fired"),
    )
    return F.collect_list(F.when((offset >= 0) & (armed | kind.isin("FIRED", "REJECTED")), event))


def _series_state() -> tuple[Column, Column, Column]:
    """(running, latest armed occurrence as (due_ms, ordinal), fired occurrences as (due_ms,
    ordinal)) of a row's version, from the ``series`` its timer's events gathered.

    An occurrence's ordinal is the one its arming event names; the version's own due time is
    its first occurrence (the request's ordinal: left null). A FIRED due time that no arming
    event names is left out, with no ordinal to send it with: timer-events lost that event.
    """
    mine = F.filter("series", lambda e: e["offset"] == F.col("offset"))
    armed = F.filter(mine, lambda e: e["ordinal"].isNotNull())
    latest = F.array_max(
        F.transform(armed, lambda e: F.struct(e["due_ms"].alias("due_ms"), e["ordinal"].alias("ordinal")))
    )
    landed = F.array_max(F.transform(F.filter(mine, lambda e: e["ordinal"].isNull()), lambda e: e["due_ms"]))
    running = F.coalesce(latest.isNotNull() & (landed.isNull() | (latest["due_ms"] > landed)), F.lit(False))
    fired_dues = F.array_distinct(F.transform(F.filter(mine, lambda e: e["fired"]), lambda e: e["due_ms"]))
    own_due = F.col("due_ms")
    fired = F.filter(
        F.transform(
            _named_occurrences(armed, fired_dues),
            lambda o: F.struct(
                o["due_ms"].alias("due_ms"),
                F.when(o["due_ms"] != own_due, o["ordinal"]).alias("ordinal"),
            ),
        ),
        lambda o: (o["due_ms"] == own_due) | o["ordinal"].isNotNull(),
    )
    return running, latest, fired


def _named_occurrences(armed: Column, dues: Column) -> Column:
    """(due_ms, ordinal) of each of ``dues`` (distinct), earliest first: the highest ordinal an
    arming event in ``armed`` names for that due time, or null.

    One sort of both lists together, not a search of the armed list per due time: a series
    that ran every second for a day has 86,400 of each. Sorted by (due, armed before fired,
    ordinal), an occurrence's arming event with the highest ordinal is right before it.
    """
    entries = F.array_sort(
        F.concat(
            F.transform(
                armed,
                lambda e: F.struct(
                    e["due_ms"].alias("due_ms"), F.lit(0).alias("fired"), e["ordinal"].alias("ordinal")
                ),
            ),
            F.transform(
                dues,
                lambda d: F.struct(
                    d.alias("due_ms"), F.lit(1).alias("fired"), F.lit(None).cast("long").alias("ordinal")
                ),
            ),
        )
    )

    # Each entry beside the one before it (zip_with evaluates both lists once: a lambda that
    # indexed ``entries`` would sort them again for every entry).
    nothing = F.lit(None).cast("long")
    first = F.struct(nothing.alias("due_ms"), F.lit(1).alias("fired"), nothing.alias("ordinal"))
    before = F.concat(F.array(first), entries)

    def named(entry: Column, previous: Column) -> Column:
        arming = (previous["fired"] == 0) & (previous["due_ms"] == entry["due_ms"])
        return F.struct(
            entry["due_ms"].alias("due_ms"),
            entry["fired"].alias("fired"),
            F.when(arming, previous["ordinal"]).alias("ordinal"),
        )

    # ``before`` is one longer: its last pairs with a null entry, left out with the arming ones.
    return F.filter(F.zip_with(entries, before, named), lambda o: o["fired"] == 1)


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
    """Every request row with its ``status`` (module doc) and ``next_kind``; for a series that
    went on, ``running``, ``occurrences`` (the (due_ms, ordinal) of those that fired; ordinal
    null for the request's own) and, while it runs, the ``due_ms`` and ``ordinal`` of its latest
    armed occurrence (``ordinal`` is null on every other row).

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

    running, latest, fired = _series_state()
    status: Column = (
        F.when(~F.col("valid"), F.lit(INVALID_RECORD))
        .when(F.col("kind") == CANCEL, F.lit(CANCEL_REQUEST))
        .when(F.col("running") & (F.col("next_kind") == CANCEL), F.lit(CANCELLED))
        .when(F.col("running") & F.col("next_kind").isNotNull(), F.lit(SUPERSEDED))
        .when(F.col("running"), F.lit(PENDING))
        .when(named("fired_at", "offset"), F.lit(FIRED))
        .when(named("rejected_at", "offset") | named("dropped_due", "due_ms"), F.lit(REJECTED))
        .when(F.col("next_kind") == CANCEL, F.lit(CANCELLED))
        .when(F.col("next_kind").isNotNull(), F.lit(SUPERSEDED))
        .otherwise(F.lit(PENDING))
    )
    dropped = ("valid", "timer_hash", "fired_at", "rejected_at", "dropped_due", "seq_ms", "series", "latest")
    is_series = F.col("series").isNotNull()
    return (
        # Only a series evaluates the list functions: for every other row ``series`` is null.
        versions.withColumn("running", is_series & running)
        .withColumn("latest", F.when(F.col("running"), latest))
        .withColumn("status", status)
        .withColumn("occurrences", F.when(is_series, fired))
        .withColumn("due_ms", F.coalesce(F.col("latest.due_ms"), F.col("due_ms")))
        .withColumn("ordinal", F.col("latest.ordinal"))
        .drop(*dropped)
    )


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
