"""Recurring timers in the jobs: a series is pending until it ends, and replay knows its occurrences."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from futures.jobs.compact import transform
from futures.jobs.config import JobConfig
from futures.jobs.occurrences import fired_or_pending, occurrence_futures
from futures.jobs.outputs import callback_records
from futures.jobs.replay import ReplayOptions, select
from futures.jobs.report import collect
from futures.jobs.report import transform as report
from futures.jobs.versions import _named_occurrences, count
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, H_OCCURRENCE, Future, Header, Recurrence, header_value
from tests.jobs.crafted import T0, Events, Kind, Log

D = T0 + 3_600_000  # first due time of every series: an hour after the log starts
MINUTE = 60_000
PARSE = JobConfig().parse_limits()


def series(timer_id: str, due_ms: int, **recurrence: int) -> bytes:
    return Future(
        callBackTopic="cb",
        callBackKey=timer_id,
        callBack=b"tick",
        id=timer_id,
        due_ms=due_ms,
        headers=[Header(key="tenant", value=b"t1")],
        recurrence=Recurrence(interval_ms=MINUTE, **recurrence),
    ).SerializeToString()


class Worker:
    """What the worker writes to `timer-events` as a series goes on."""

    def __init__(self, events: Events, timer_id: str, offset: int) -> None:
        self.events, self.timer_id, self.offset = events, timer_id, offset
        events.add(Kind.SCHEDULED, 0, timer_id, offset, D)  # at ingest: no reason

    def fired(self, due_ms: int, next_ordinal: int | None = None, rejected: bool = False) -> None:
        """The occurrence due at ``due_ms`` fired (or its callback was dead-lettered), and the next
        one, ``next_ordinal``, armed a minute later, unless the series is over."""
        kind = Kind.REJECTED if rejected else Kind.FIRED
        self.events.add(kind, 0, self.timer_id, self.offset, due_ms)
        if next_ordinal is not None:
            reason = f"occurrence {next_ordinal}"
            self.events.add(Kind.SCHEDULED, 0, self.timer_id, self.offset, due_ms + MINUTE, reason)


@pytest.fixture(scope="module")
def logs() -> tuple[Log, Events, dict[str, int]]:
    log, events, at = Log(), Events(batch_size=3), {}
    at["runs"] = log.append(0, series("runs", D), b"runs")
    runs = Worker(events, "runs", at["runs"])
    runs.fired(D, 2)
    runs.fired(D + MINUTE, 3)
    runs.fired(D + MINUTE, 3)  # a crash repeated the occurrence, and armed the same next one
    at["ends"] = log.append(0, series("ends", D, max_count=2), b"ends")
    ends = Worker(events, "ends", at["ends"])
    ends.fired(D, 2)
    ends.fired(D + MINUTE)  # its last occurrence: nothing armed
    at["cancelled"] = log.append(0, series("cancelled", D), b"cancelled")
    Worker(events, "cancelled", at["cancelled"]).fired(D, 2)
    log.cancel(0, "cancelled")
    at["replaced"] = log.append(0, series("replaced", D), b"replaced")
    Worker(events, "replaced", at["replaced"]).fired(D, 2)
    at["replacement"] = log.append(0, series("replaced", D + MINUTE // 2), b"replaced")
    at["dead"] = log.append(0, series("dead", D), b"dead")
    Worker(events, "dead", at["dead"]).fired(D, 2, rejected=True)  # dead-lettered: the series goes on
    at["waiting"] = log.append(0, series("waiting", D + 90_000), b"waiting")
    at["continued"] = log.append(0, series("continued", D, ordinal=5, first_due_ms=D - 60 * MINUTE), b"c")
    Worker(events, "continued", at["continued"]).fired(D, 6)
    at["plain"] = log.schedule(0, "plain", D + 10_000)
    at["plain-fired"] = log.schedule(0, "plain-fired", D + 20_000)
    events.add(Kind.FIRED, 0, "plain-fired", at["plain-fired"], D + 20_000)
    events.close()
    return log, events, at


def test_a_series_is_pending_as_its_latest_occurrence_until_it_ends(spark: SparkSession, logs) -> None:
    log, events, at = logs
    compaction = transform(log.df(spark), events.df(spark), PARSE)
    pending = {r["timer_id"]: r for r in compaction.pending.collect()}
    assert {i: (r["offset"], r["due_ms"]) for i, r in pending.items()} == {
        "runs": (at["runs"], D + 2 * MINUTE),
        "replaced": (at["replacement"], D + MINUTE // 2),
        "dead": (at["dead"], D + MINUTE),
        "waiting": (at["waiting"], D + 90_000),
        "continued": (at["continued"], D + MINUTE),
        "plain": (at["plain"], D + 10_000),
    }
    # The Future is the occurrence the worker holds: what a replay re-publishes for it to go on.
    futures = {i: Future.FromString(r["future"]) for i, r in pending.items()}
    runs = futures["runs"]
    assert (runs.due_ms, runs.recurrence.ordinal, runs.recurrence.first_due_ms) == (D + 2 * MINUTE, 3, D)
    assert (runs.recurrence.interval_ms, runs.callBack, list(runs.headers)) == (
        MINUTE,
        b"tick",
        [Header(key="tenant", value=b"t1")],
    )
    continued = futures["continued"].recurrence
    assert (continued.ordinal, continued.first_due_ms) == (6, D - 60 * MINUTE)
    assert futures["waiting"].SerializeToString() == series("waiting", D + 90_000)  # as requested

    counts = count(compaction.classified, compaction.events)
    assert (counts.pending, counts.fired, counts.cancelled, counts.superseded) == (6, 2, 1, 1)
    # The report counts a running series at its next occurrence.
    due = collect(report(compaction.pending, compaction.events, "minute"), "minute").due
    assert dict(due) == Counter(r["due_ms"] - r["due_ms"] % MINUTE for r in pending.values())


def test_compacting_on_a_base_follows_a_series_from_the_snapshot(spark: SparkSession) -> None:
    first, later, first_events, later_events = Log(), Log(), Events(), Events()
    o_runs = first.append(0, series("runs", D), b"runs")
    o_ends = first.append(1, series("ends", D, max_count=2), b"ends")
    Worker(first_events, "runs", o_runs).fired(D, 2)
    Worker(first_events, "ends", o_ends).fired(D, 2)
    later._next.update(first._next)
    later_events.add(Kind.FIRED, 0, "runs", o_runs, D + MINUTE)
    later_events.add(Kind.SCHEDULED, 0, "runs", o_runs, D + 2 * MINUTE, "occurrence 3")
    later_events.add(Kind.FIRED, 1, "ends", o_ends, D + MINUTE)

    base = transform(first.df(spark), first_events.df(spark), PARSE).pending
    incremental = transform(later.df(spark), later_events.df(spark), PARSE, base=base).pending
    everything = Log(rows=first.rows + later.rows)
    all_events = Events(Log("timer-events", first_events.log.rows + later_events.log.rows))
    full = transform(everything.df(spark), all_events.df(spark), PARSE).pending
    rows = {(r["timer_id"], r["due_ms"], r["future"]) for r in incremental.collect()}
    assert rows == {(r["timer_id"], r["due_ms"], r["future"]) for r in full.collect()}
    ((timer_id, due_ms, raw),) = rows
    assert (timer_id, due_ms, Future.FromString(raw).recurrence.ordinal) == ("runs", D + 2 * MINUTE, 3)


def test_replaying_a_window_re_sends_each_occurrence_in_it_with_its_due_time_and_ordinal(
    spark: SparkSession, logs
) -> None:
    log, events, _ = logs
    classified = transform(log.df(spark), events.df(spark), PARSE).classified
    options = ReplayOptions(to_topic="cb", due_from_ms=D + 1, due_to_ms=D + 3 * MINUTE)
    records = callback_records(select(fired_or_pending(classified), options)).collect()
    sent = {
        (
            header_value(h, H_ID).decode(),
            int(header_value(h, H_DUE_MS)),
            (header_value(h, H_OCCURRENCE) or b"-").decode(),
        )
        for h in ([(x["key"], x["value"]) for x in r["headers"]] for r in records)
    }
    assert sent == {
        ("runs", D + MINUTE, "2"),  # fired (twice: once re-sent)
        ("runs", D + 2 * MINUTE, "3"),  # pending
        ("ends", D + MINUTE, "2"),  # its last
        ("dead", D + MINUTE, "2"),  # pending: occurrence 1 was dead-lettered, not sent
        ("continued", D + MINUTE, "6"),
        ("replaced", D + MINUTE // 2, "1"),  # the replacement's first; the old one's 2 never fired
        ("waiting", D + 90_000, "1"),
        ("plain", D + 10_000, "-"),
        ("plain-fired", D + 20_000, "-"),
    }
    assert len(records) == len(sent)
    # Headers as the worker lays them out: the user's, then kt-occurrence before kt-id.
    runs = next(r for r in records if r["key"] == b"runs")
    assert [h["key"] for h in runs["headers"]] == ["tenant", H_OCCURRENCE, H_ID, H_DUE_MS, H_FIRED_MS]
    assert runs["value"] == b"tick"


def test_occurrence_futures_rewrite_only_the_rows_given() -> None:
    raw = series("s", D)
    got = occurrence_futures(
        pa.array([None, raw], pa.binary()), pa.array([D, D + MINUTE]), pa.array([None, 2])
    ).to_pylist()
    assert got[0] is None
    nxt = Future.FromString(got[1])
    assert (nxt.due_ms, nxt.recurrence.ordinal, nxt.recurrence.first_due_ms) == (D + MINUTE, 2, D)
    nothing = pa.array([None, None], pa.binary())
    assert occurrence_futures(nothing, pa.array([D, D]), pa.array([None, None])).null_count == 2


def _occurrences_named(armed: list[tuple[int, int]], dues: list[int]) -> list[tuple[int, int | None]]:
    """What a reader of the log makes of a series' occurrences: for each due time that fired,
    the highest ordinal an arming event names for it, or None; earliest first."""
    best: dict[int, int] = {}
    for due, ordinal in armed:
        best[due] = max(ordinal, best.get(due, ordinal))
    return [(due, best.get(due)) for due in sorted(set(dues))]


def test_each_fired_occurrence_gets_the_ordinal_its_arming_named_even_in_a_long_series(
    spark: SparkSession,
) -> None:
    day = 86_400
    cases = [
        # Armed twice for one due time (a crash repeated an arming), an arming lost, one never fired.
        ([(1_000, 1), (2_000, 2), (2_000, 3), (4_000, 5)], [3_000, 2_000, 1_000, 5_000, 2_000]),
        ([], [7_000]),
        ([(9_000, 4)], []),
        # A series that ran every second for a day: one sort, not a search per occurrence.
        ([(T0 + 1000 * s, s + 1) for s in range(day)], [T0 + 1000 * s for s in range(0, day, 2)]),
    ]
    rows = spark.createDataFrame(
        [([{"due_ms": d, "ordinal": o} for d, o in armed], dues) for armed, dues in cases],
        "armed array<struct<due_ms: bigint, ordinal: bigint>>, dues array<bigint>",
    )
    named = rows.select(_named_occurrences(F.col("armed"), F.array_distinct("dues")).alias("named")).collect()
    assert [[(o["due_ms"], o["ordinal"]) for o in row["named"]] for row in named] == [
        _occurrences_named(armed, dues) for armed, dues in cases
    ]
