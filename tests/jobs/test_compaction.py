"""Compaction correctness on a crafted log: what stays pending, and the counts an operator reads."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from futures.jobs.compact import transform
from futures.jobs.config import JobConfig
from futures.jobs.versions import count
from ktimers.config import CommonConfig, IngressFormat, TopicsConfig
from ktimers.wire import KIND_HEADER, Future
from tests.jobs.crafted import T0, Events, Kind, Log

D = T0 + 3_600_000  # due times: an hour after the log starts
PARSE = JobConfig().parse_limits()


def pending_of(frame: DataFrame) -> dict[tuple[int, str], tuple[int, int]]:
    """(partition, timer id) → (offset, due ms) of each pending timer."""
    return {(r["partition"], r["timer_id"]): (r["offset"], r["due_ms"]) for r in frame.collect()}


@pytest.fixture(scope="module")
def crafted() -> tuple[Log, Events, dict[str, int]]:
    log, events, at = Log(), Events(), {}
    # Versions: the latest of three wins.
    log.schedule(0, "a", D + 1)
    log.schedule(0, "a", D + 2)
    at["a"] = log.schedule(0, "a", D + 3)
    # Cancelled; and cancelled then scheduled again.
    log.schedule(0, "b", D)
    log.cancel(0, "b")
    log.schedule(0, "c", D)
    log.cancel(0, "c")
    at["c"] = log.schedule(0, "c", D + 5)
    # Fired; and fired, then scheduled again under the same id.
    at["d"] = log.schedule(0, "d", D)
    events.add(Kind.FIRED, 0, "d", at["d"], D)
    at["e1"] = log.schedule(0, "e", D)
    events.add(Kind.FIRED, 0, "e", at["e1"], D)
    at["e"] = log.schedule(0, "e", D + 9)
    # Rejected by the worker: by offset, and dropped as too late (no offset, matched by due time).
    at["f"] = log.schedule(0, "f", D)
    events.add(Kind.REJECTED, 0, "f", at["f"], D)
    log.schedule(0, "g", D + 7)
    events.add(Kind.REJECTED, 0, "g", -1, D + 7)
    # A cancel that comes after the timer fired changes nothing; one for an unknown id neither.
    at["h"] = log.schedule(0, "h", D)
    events.add(Kind.FIRED, 0, "h", at["h"], D)
    log.cancel(0, "h")
    log.cancel(0, "nobody")
    # Seed format: no id, keyed by the due second. One stays pending, one fired.
    at["seed"] = log.seed(1, (D // 1000) + 60)
    at["seed-fired"] = log.seed(1, (D // 1000) + 61)
    events.add(Kind.FIRED, 1, f"seed-1-{at['seed-fired']}", at["seed-fired"], D + 61_000)
    # The same id in two partitions: two timers (the worker keeps one table per partition).
    at["x2"] = log.schedule(2, "x", D)
    at["x3"] = log.schedule(3, "x", D + 1)
    # Bad input: counted, never fatal.
    log.append(0, b"\xff\xff\xff", b"junk")
    log.append(0, Future(callBackTopic="cb").SerializeToString(), b"k", [(KIND_HEADER, b"frobnicate")])
    log.append(0, None, b"a")
    log.append(0, Future(callBackTopic="cb", callBack=b"v").SerializeToString(), b"not-a-second")
    log.append(0, b"", b"k", [(KIND_HEADER, b"cancel")])
    events.log.append(0, b"\xff\xff\xff")
    events.log.append(0, None)
    return log, events, at


def test_pending_set_is_latest_version_minus_fired_cancelled_rejected(spark: SparkSession, crafted) -> None:
    log, events, at = crafted
    compaction = transform(log.df(spark), events.df(spark), PARSE)
    pending = pending_of(compaction.pending)
    seed_id = f"seed-1-{at['seed']}"
    assert pending == {
        (0, "a"): (at["a"], D + 3),
        (0, "c"): (at["c"], D + 5),
        (0, "e"): (at["e"], D + 9),
        (1, seed_id): (at["seed"], ((D // 1000) + 60) * 1000),
        (2, "x"): (at["x2"], D),
        (3, "x"): (at["x3"], D + 1),
    }
    # The snapshot keeps the Future normalised: a seed request gets its id and due time.
    seed_row = compaction.pending.filter(f"timer_id = '{seed_id}'").first()
    future = Future.FromString(seed_row["future"])
    assert (future.id, future.due_ms, future.callBack) == (seed_id, ((D // 1000) + 60) * 1000, b"seed")


def test_counts_say_what_happened_to_every_record(spark: SparkSession, crafted) -> None:
    log, events, _ = crafted
    compaction = transform(log.df(spark), events.df(spark), PARSE)
    counts = count(compaction.classified, compaction.events)
    assert counts.read == len(log.rows)
    assert (counts.superseded, counts.cancelled, counts.fired, counts.rejected, counts.pending) == (
        2,
        2,
        4,
        2,
        6,
    )
    assert counts.cancels == 4
    assert counts.schedules == 16
    assert dict(counts.invalid) == {
        "bad-due-time": 1,
        "missing-id": 1,
        "tombstone": 1,
        "undecodable": 1,
        "unknown-kind": 1,
    }
    assert (counts.events_read, counts.events_invalid) == (len(events.log.rows), 2)


def test_compacting_from_a_base_snapshot_equals_compacting_everything(spark: SparkSession) -> None:
    """Snapshot, then compact only what came after on top of it: the same pending set."""
    first, later = Log(), Log()
    first_events, later_events = Events(), Events()
    o_fires_later = first.schedule(0, "fires-later", D)
    first.schedule(0, "cancelled-later", D)
    first.schedule(0, "replaced-later", D)
    o_stays = first.schedule(1, "stays", D)
    o_fired = first.schedule(1, "fired-early", D)
    first_events.add(Kind.FIRED, 1, "fired-early", o_fired, D)
    # What the log gains after the snapshot (offsets continue where the first part ended).
    later._next.update(first._next)
    later_events.log._next.update(first_events.log._next)
    later_events.add(Kind.FIRED, 0, "fires-later", o_fires_later, D)
    later.cancel(0, "cancelled-later")
    o_replaced = later.schedule(0, "replaced-later", D + 1)
    o_new = later.schedule(1, "new", D + 2)

    everything = Log(rows=first.rows + later.rows)
    all_events = Events(Log("timer-events", first_events.log.rows + later_events.log.rows))
    full = pending_of(transform(everything.df(spark), all_events.df(spark), PARSE).pending)

    base = transform(first.df(spark), first_events.df(spark), PARSE).pending
    incremental = transform(later.df(spark), later_events.df(spark), PARSE, base=base)
    assert (
        pending_of(incremental.pending)
        == full
        == {
            (1, "stays"): (o_stays, D),
            (0, "replaced-later"): (o_replaced, D + 1),
            (1, "new"): (o_new, D + 2),
        }
    )
    counts = count(incremental.classified, incremental.events)
    assert (counts.read, counts.base) == (len(later.rows), 4)


def test_versions_from_two_request_topics_are_ordered_by_time(spark: SparkSession) -> None:
    """An extra ingress topic feeds the same partitions: the later request wins, whatever its topic."""
    topics = TopicsConfig(ingress=(("extra-requests", IngressFormat.NATIVE),))
    parse = JobConfig(common=CommonConfig(topics=topics)).parse_limits()
    main, extra = Log(), Log("extra-requests")
    main.schedule(0, "m-then-x", D + 1, payload=b"main")  # ts T0 + 0
    main.schedule(0, "x-then-m", D + 2, payload=b"main", timestamp_ms=T0 + 50)
    extra.schedule(0, "m-then-x", D + 3, payload=b"extra", timestamp_ms=T0 + 20)
    extra.schedule(0, "x-then-m", D + 4, payload=b"extra", timestamp_ms=T0 + 30)
    # A producer clock running backwards within one topic never reorders that topic.
    o_first = extra.schedule(1, "skewed", D + 5, timestamp_ms=T0 + 900)
    extra.schedule(1, "skewed", D + 6, timestamp_ms=T0 + 100)
    pending = transform(main.df(spark).unionByName(extra.df(spark)), Events().df(spark), parse).pending
    got = {(r["timer_id"], r["topic"], r["due_ms"]) for r in pending.collect()}
    assert got == {
        ("m-then-x", "extra-requests", D + 3),
        ("x-then-m", "timer-request", D + 2),
        ("skewed", "extra-requests", D + 6),
    }
    assert o_first == 0
