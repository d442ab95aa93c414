"""The join of ticks and requests is ordered by time: a worker far behind on requests still
honours every cancel and replacement written before a timer's tick."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import Producer

from futures.client import TimerHandle
from ktimers.wire import KIND_BATCH, KIND_HEADER, Future, FutureBatch, TimerEvent, decode_events
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

Kind = TimerEvent.Kind

#: Requests written just before the cancels, in records of BACKLOG_BATCH timers each (a long
#: backlog written in a second on any machine): at ~80 k timers/s of ingest, ~20 s of work.
BACKLOG_TIMERS = 1_600_000
BACKLOG_BATCH = 20
#: Timers under test of each kind: kept, cancelled, replaced at the same due time, moved later.
EACH = 150
#: How long before their timers' due time the cancels and replacements are all written (s).
MARGIN_S = 5.0


def backlog_requests(callback_topic: str, timers: int, per_record: int) -> list[bytes]:
    """``FutureBatch`` records of ``per_record`` valid timers each, ``timers`` in all, due in a day
    (built before the test's clock runs: it takes seconds on a busy machine)."""
    due_ms = (int(time.time()) + 86_400) * 1000
    base = Future(callBackTopic=callback_topic, callBackKey="backlog", callBack=b"b", due_ms=due_ms)
    records = []
    for at in range(0, timers, per_record):
        batch = FutureBatch()
        for i in range(at, at + per_record):
            future = batch.futures.add()
            future.CopyFrom(base)
            future.id = f"backlog-{i:07d}"
        records.append(batch.SerializeToString())
    return records


def produce_backlog(stack: Stack, values: list[bytes]) -> float:
    """Write the requests ``values`` over every partition; the seconds it took. They are what the
    worker must apply before any tick that comes after them."""
    partitions = stack.common.topics.partitions
    producer = Producer(
        {
            "bootstrap.servers": stack.bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": len(values) + 1,
        }
    )
    topic = stack.common.topics.request
    started = time.monotonic()
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % partitions, headers=[(KIND_HEADER, KIND_BATCH)])
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return time.monotonic() - started


def timer_events(stack: Stack, ids: set[str], until: int, timeout_s: float) -> list[TimerEvent]:
    """The events of ``ids`` on `timer-events`, in order, once there are ``until`` of them and
    every id has one (a count alone may be reached by the partitions read first)."""
    reader = stack.reader(stack.common.topics.events)
    deadline = time.monotonic() + timeout_s
    found: list[TimerEvent] = []
    while (len(found) < until or {e.id for e in found} < ids) and time.monotonic() < deadline:
        reader.poll(0.5)
        found = [e for r in reader.records for e in decode_events(r.value, r.headers) if e.id in ids]
    return found


def wait_histogram(stack: Stack, name: str) -> dict[str, float]:
    """A histogram's samples on the worker's /metrics: ``le`` bound (as text) → cumulative count,
    plus ``sum`` and ``count``."""
    samples = stack.metrics()
    out = {"sum": samples[f"{name}_sum"], "count": samples[f"{name}_count"]}
    for key, value in samples.items():
        if key.startswith(f'{name}_bucket{{le="'):
            out[key.split('"')[1]] = value
    return out


def test_cancels_and_replacements_hold_while_the_worker_is_far_behind(running: Stack) -> None:
    reader = running.callback_topic("join")
    backlog = backlog_requests(reader.topic, BACKLOG_TIMERS, BACKLOG_BATCH)
    started = time.time()
    # The timers under test are due in this second (and the next): late enough for the requests,
    # the backlog and the cancels to be written MARGIN_S before it on a slow machine too, early
    # enough that the worker is still applying the backlog then (~20 s of work at 80 k timers/s).
    due_at = int(started) + 11
    kinds = ("kept", "cancelled", "same-due", "moved")
    handles: dict[tuple[str, int], TimerHandle] = {}
    with running.client() as client:
        for kind in kinds:
            for i in range(EACH):
                at = due_at + i / EACH
                handles[kind, i] = client.schedule(reader.topic, f"{kind}-{i}", "v1", at=at, id=f"{kind}-{i}")
    running.wait_for_metric("timers_pending", lambda v: v == len(handles), timeout_s=20)

    # The worker falls behind: over a million requests to apply, written first.
    backlog_s = produce_backlog(running, backlog)
    with running.client() as client:
        for i in range(EACH):
            client.cancel(handles["cancelled", i])
            client.schedule(reader.topic, f"same-due-{i}", "v2", at=handles["same-due", i].due_ms / 1000,
                            id=f"same-due-{i}")  # fmt: skip
            client.schedule(reader.topic, f"moved-{i}", "v2", at=handles["moved", i].due_ms / 1000 + 1,
                            id=f"moved-{i}")  # fmt: skip
    written_ms = time.time_ns() // 1_000_000
    first_due_ms = min(h.due_ms for h in handles.values())
    assert written_ms + MARGIN_S * 1000 <= first_due_ms, (
        f"the timers, the backlog ({backlog_s:.1f}s) and the cancels took {written_ms / 1000 - started:.1f}s "
        f"to write: the cancels went out only {(first_due_ms - written_ms) / 1000:.1f}s before the first "
        "timer was due"
    )

    # What must fire: the kept timers, and the last version of each replaced one.
    expected = {f"kept-{i}": handles["kept", i].due_ms for i in range(EACH)}
    expected |= {f"same-due-{i}": handles["same-due", i].due_ms for i in range(EACH)}
    expected |= {f"moved-{i}": handles["moved", i].due_ms + 1000 for i in range(EACH)}
    reader.read_until(lambda r: {c.timer_id for c in r} >= set(expected), timeout_s=60)
    reader.poll(2.0)  # a cancelled timer or an old version firing late would show up now

    callbacks = reader.records
    counts = Counter(c.timer_id for c in callbacks)
    # How far behind the worker was: when it applied the cancels (events say), how long ticks waited.
    cancelled = {f"cancelled-{i}": handles["cancelled", i].due_ms for i in range(EACH)}
    events = timer_events(running, set(cancelled), until=2 * EACH, timeout_s=20)
    applied = {e.id: e.at_ms for e in events if e.kind == Kind.CANCELLED}
    after_due = [i for i, at_ms in applied.items() if at_ms > cancelled[i]]
    behind_s = (min(applied.values(), default=written_ms) - written_ms) / 1000
    waits = wait_histogram(running, "timers_join_wait_seconds")
    late = sorted(c.fired_ms - c.due_ms for c in callbacks)
    print(
        f"\nbacklog of {BACKLOG_TIMERS:,} timers written in {backlog_s:.1f}s; cancels applied from "
        f"{behind_s:.1f}s after they were written, {len(after_due)} of {EACH} after their timer was due; "
        f"ticks waited {waits['sum']:.1f}s in all ({waits['count']:.0f} ticks, "
        f"{waits['count'] - waits['2.0']:.0f} over 2s, {waits['count'] - waits['5.0']:.0f} over 5s), "
        f"{running.metric_sum('timers_join_wait_bound_total'):.0f} past the bound; "
        f"lateness p50 {late[len(late) // 2] / 1000:.1f}s, max {late[-1] / 1000:.1f}s; "
        f"{sum(counts.values()) - len(counts)} repeats"
    )

    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} of {len(expected)} timers never fired, e.g. {sorted(missing)[:3]}"
    fired_cancelled = [c for c in callbacks if c.timer_id in cancelled]
    assert not fired_cancelled, (
        f"{len(fired_cancelled)} cancelled timers fired, e.g. {fired_cancelled[0]}; its events (kind, ms): "
        f"{[(e.kind, e.at_ms) for e in events if e.id == fired_cancelled[0].timer_id]}"
    )
    replaced = ("same-due-", "moved-")
    old_versions = [c for c in callbacks if c.timer_id.startswith(replaced) and c.value != b"v2"]
    assert not old_versions, f"{len(old_versions)} replaced versions fired, e.g. {old_versions[0]}"
    assert set(counts) == set(expected), f"unexpected callbacks: {sorted(set(counts) - set(expected))[:5]}"
    early = [c for c in callbacks if min(c.received_ms, c.fired_ms) < expected[c.timer_id]]
    assert not early, f"{len(early)} fired early, e.g. {early[0]}"
    assert all(c.due_ms == expected[c.timer_id] for c in callbacks), "a callback names another due time"
    kinds_seen = {i: [e.kind for e in events if e.id == i] for i in cancelled}
    assert all(k == [Kind.SCHEDULED, Kind.CANCELLED] for k in kinds_seen.values()), kinds_seen

    # The worker was behind for real: it applied most cancels only after their timers were due
    # (without the join, those timers would have fired), and ticks waited for them.
    assert len(after_due) >= EACH // 2, (
        f"the worker was only {behind_s:.1f}s behind: {EACH - len(after_due)} of {EACH} cancels were "
        "applied before their timers were due"
    )
    assert waits["count"] - waits["2.0"] > 0, f"no tick waited more than 2s for requests: {waits}"
    assert running.metric_sum("timers_join_wait_bound_total") == 0
