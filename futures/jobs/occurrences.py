"""Timers as occurrences: what a snapshot keeps and what a replay re-sends, series included.

A one-shot timer is one occurrence, its request's ``Future``. A recurring timer
(:mod:`ktimers.recurrence`) that went on is, while it runs, its latest armed
occurrence — the request's ``Future`` with that due time, ordinal and first due time,
as the worker holds it — and each of its occurrences that fired is a callback the
worker sent, with that occurrence's due time and ordinal (:func:`~futures.jobs.versions.classify`
finds them). The Futures are rewritten in Python, by :func:`ktimers.recurrence.occurrence`,
for those rows only: every other row passes a null to the function and keeps its bytes.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from futures.jobs.snapshot import SNAPSHOT_COLUMNS
from futures.jobs.versions import FIRED, PENDING
from ktimers.recurrence import occurrence
from ktimers.wire import Future


def occurrence_futures(futures: pa.Array, dues: pa.Array, ordinals: pa.Array) -> pa.Array:
    """Each serialized ``Future`` as its occurrence ``ordinal`` due at ``due`` (epoch ms); null stays null."""
    where = pc.indices_nonzero(pc.is_valid(futures))
    if not len(where):
        return futures
    out: list[bytes | None] = [None] * len(futures)
    rows = zip(
        where.to_pylist(),
        futures.take(where).to_pylist(),
        dues.take(where).to_pylist(),
        ordinals.take(where).to_pylist(),
        strict=True,
    )
    for i, raw, due, ordinal in rows:
        out[i] = occurrence(Future.FromString(raw), due, ordinal).SerializeToString()
    return pa.array(out, pa.binary())


# Typed by its hints (pa.Array in and out), which PySpark prefers; its stubs still want a type.
_occurrence_futures = F.arrow_udf(occurrence_futures, BinaryType())  # type: ignore[call-overload]


def _future() -> Column:
    """The row's ``future`` as the occurrence its ``due_ms`` and ``ordinal`` name."""
    moved = F.col("ordinal").isNotNull()
    rewritten = _occurrence_futures(F.when(moved, F.col("future")), F.col("due_ms"), F.col("ordinal"))
    return F.coalesce(rewritten, F.col("future"))


def pending_timers(classified: DataFrame) -> DataFrame:
    """The pending timers of :func:`~futures.jobs.versions.classify`'s rows, in snapshot columns:
    a running series as its latest armed occurrence."""
    pending = classified.filter(F.col("status") == PENDING)
    return pending.withColumn("future", _future()).select(*SNAPSHOT_COLUMNS[:-1])


def fired_or_pending(classified: DataFrame) -> DataFrame:
    """Every occurrence of :func:`~futures.jobs.versions.classify`'s rows that fired or is pending,
    a row each, in snapshot columns with ``status`` (fired or pending).

    A series' fired occurrences are all there, whatever became of the series since (a callback
    sent is sent), and its pending one; a one-shot timer is its version, if fired or pending.
    """
    no_ordinal = F.lit(None).cast("long")
    one_shot = F.when(F.col("status") == FIRED, F.array(_item(F.col("due_ms"), no_ordinal, FIRED)))
    series = F.transform("occurrences", lambda o: _item(o["due_ms"], o["ordinal"], FIRED))
    fired = F.coalesce(F.when(F.col("occurrences").isNotNull(), series), one_shot, F.array())
    pending = F.when(
        F.col("status") == PENDING, F.array(_item(F.col("due_ms"), F.col("ordinal"), PENDING))
    ).otherwise(F.array())
    timers = classified.filter(F.col("status").isin(PENDING, FIRED) | F.col("occurrences").isNotNull())
    items = timers.select("*", F.explode(F.concat(fired, pending)).alias("item")).drop(
        "due_ms", "ordinal", "status"
    )
    exploded = items.select("*", "item.due_ms", "item.ordinal", "item.status").drop("item")
    return exploded.withColumn("future", _future()).select(*SNAPSHOT_COLUMNS[:-1], "status")


def _item(due_ms: Column, ordinal: Column, status: str) -> Column:
    return F.struct(due_ms.alias("due_ms"), ordinal.alias("ordinal"), F.lit(status).alias("status"))
