"""The compaction (fast decoding, Spark SQL classification, counts taken while writing) equals the slow,
obvious computation of :mod:`tests.jobs.oracle` on a crafted log: the same pending set, the same counts."""

from __future__ import annotations

import random

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from futures.jobs.compact import events_seen, transform
from futures.jobs.config import JobConfig
from futures.jobs.versions import PENDING, count, count_columns, count_events, counts_of
from ktimers.config import CommonConfig, IngressFormat, TopicsConfig
from ktimers.wire import KIND_BATCH, KIND_HEADER, Future, FutureBatch
from tests.jobs import oracle
from tests.jobs.crafted import T0, Events, Kind, Log

D = T0 + 3_600_000
EXTRA = "extra-requests"
CONFIG = JobConfig(common=CommonConfig(topics=TopicsConfig(ingress=((EXTRA, IngressFormat.NATIVE),))))
PARSE = CONFIG.parse_limits()


def crafted_log(seed: int = 11, records: int = 1500) -> tuple[Log, Log, Events]:
    """Two request topics and the events: versions, cancels, fires, rejections, drops, batches, junk."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible log
    main, extra = Log(), Log(EXTRA)
    # Events as workers write them now (batches) and as older ones did (a record each).
    batched = Events(batch_size=7)
    single = Events(log=batched.log)
    ids = [f"t{n}" for n in range(200)]
    for n in range(records):
        log = extra if rng.random() < 0.2 else main
        partition = rng.randrange(3)
        timer = rng.choice(ids)
        roll = rng.random()
        ts = T0 + n * 10 + rng.randrange(-30, 30)  # clocks of two producers disagree a little
        if roll < 0.55:
            due = D + rng.randrange(100_000)
            offset = log.schedule(partition, timer, due, payload=bytes([n % 256]), timestamp_ms=ts)
            fate = rng.random()
            events = batched if n < records // 2 else single
            if fate < 0.2:
                events.add(Kind.FIRED, partition, timer, offset, due)
            elif fate < 0.25:
                events.add(Kind.REJECTED, partition, timer, offset, due)
            elif fate < 0.28:
                events.add(Kind.REJECTED, partition, timer, -1, due)  # too late, dropped: no offset
        elif roll < 0.75:
            log.cancel(partition, timer)
        elif roll < 0.8:
            log.seed(partition, (D // 1000) + rng.randrange(100))
        elif roll < 0.85:
            futures = [Future(id=rng.choice(ids), due_ms=D + rng.randrange(1000), callBackTopic="cb")
                       for _ in range(rng.randrange(1, 4))]  # fmt: skip
            if rng.random() < 0.3:
                futures.append(Future(id="no-due", callBackTopic="cb"))  # refused: a batch timer needs due_ms
            log.append(partition, FutureBatch(futures=futures).SerializeToString(), b"batch",
                       [(KIND_HEADER, KIND_BATCH)], ts)  # fmt: skip
        elif roll < 0.9:
            refused = [Future(id=timer, due_ms=-5, callBackTopic="cb"),
                       Future(id=timer, due_ms=D, callBackTopic="__internal"),
                       Future(id=timer, due_ms=D, callBackTopic="")]  # fmt: skip
            bad = rng.choice([b"\xff\xff", None, *(f.SerializeToString() for f in refused)])
            log.append(partition, bad, timer.encode(), timestamp_ms=ts)
        else:
            log.schedule(partition, timer, D + n, timestamp_ms=ts)
    batched.close()
    events = single
    events.log.append(0, b"\xff\xff")
    events.log.append(1, None)
    events.log.append(2, b"\xff\xff", b"2", [(KIND_HEADER, KIND_BATCH)])  # a batch that does not decode
    return main, extra, events


def test_compaction_equals_the_record_by_record_oracle(spark: SparkSession) -> None:
    main, extra, events = crafted_log()
    expected = oracle.compact(main.rows + extra.rows, events.log.rows, PARSE)
    assert expected.statuses["fired"] and expected.statuses["rejected"] and expected.statuses["cancelled"]
    assert len(expected.invalid) >= 4 and len(expected.pending) > 50  # the log exercises every rule

    requests = main.df(spark).unionByName(extra.df(spark))
    compaction = transform(requests, events.df(spark), PARSE)
    observation = Observation("counts")
    observed = compaction.classified.observe(observation, *count_columns())
    pending = {
        (r["partition"], r["timer_id"]): (r["topic"], r["offset"], r["idx"], r["due_ms"], r["future"])
        for r in observed.filter(F.col("status") == PENDING).collect()
    }
    assert pending.keys() == expected.pending.keys()
    for timer, (topic, offset, idx, due, future) in pending.items():
        e_topic, e_offset, e_idx, e_due, e_future = expected.pending[timer]
        assert (topic, offset, idx, due) == (e_topic, e_offset, e_idx, e_due), timer
        assert Future.FromString(future) == Future.FromString(e_future), timer

    counts = counts_of(observation.get, count_events(compaction.events))
    assert counts is not None
    assert counts == count(compaction.classified, compaction.events)
    s = expected.statuses
    assert (counts.pending, counts.fired, counts.rejected, counts.cancelled, counts.superseded) == (
        s["pending"], s["fired"], s["rejected"], s["cancelled"], s["superseded"],
    )  # fmt: skip
    assert counts.cancels == s["cancel"]
    assert dict(counts.invalid) == dict(expected.invalid)
    assert counts.read == sum(s.values())
    assert (counts.events_read, counts.events_invalid) == expected.events


def test_events_are_counted_by_the_pass_that_classifies(spark: SparkSession) -> None:
    """The events read for the classification are counted on the way; where Spark drops them from
    the plan (nothing to classify), there is no count, and the job counts them in a pass of their own."""
    main, extra, events = crafted_log()
    expected = oracle.compact(main.rows + extra.rows, events.log.rows, PARSE)
    compaction = transform(main.df(spark).unionByName(extra.df(spark)), events.df(spark), PARSE)
    compaction.pending.write.format("noop").mode("overwrite").save()
    assert events_seen(compaction) == count_events(compaction.events) == expected.events

    nothing = transform(Log().df(spark), events.df(spark), PARSE)
    nothing.pending.write.format("noop").mode("overwrite").save()
    assert events_seen(nothing) is None
