"""The timer engine end to end, without a broker: requests in, ticks in, callbacks out.

A :class:`Rig` wires a real :class:`TimerEngine` to RocksDB tables under ``tmp_path``
and a :class:`FakeProducer`, with a clock the test moves.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError

from futures.ingress.records import SourceRecord
from futures.worker import engine as engine_module
from futures.worker.config import LatePolicy, WorkerConfig
from futures.worker.engine import TimerEngine, wall_clock_ms
from futures.worker.kafka import KafkaWriter
from futures.worker.table import PROGRESS_KEY, TIMER_PREFIX, PartitionTimers, progress_record
from ktimers.config import BrokerProfile, CommonConfig, KafkaConfig
from ktimers.errors import DeliveryError
from ktimers.wire import Future, encode_second_key
from tests.worker.fakes import FakeProducer, Sent, permanent_error, transient_error
from tests.worker.rig import T_MS, Kind, MakeRig, Rig, T  # noqa: F401
from tests.worker.test_precise import WallClockRig

# -- firing on ticks ----------------------------------------------------------


def test_a_request_read_again_after_a_restart_does_not_fire_again(rig):
    first = rig.request("once", T_MS - 500)
    rig.ingest(first)
    rig.tick(T)
    assert rig.fired() == ["once"]
    # A restarted (or new) owner resumes from an older committed consumer offset.
    rig.ingest(first, rig.request("new", T_MS - 400))
    rig.tick(T + 1)
    assert rig.fired() == ["once", "new"]
    assert rig.metrics.requests_skipped._value.get() == 1
    # The applied offset travels in the changelog, so a rebuilt table skips it too.
    rebuilt = PartitionTimers(rig.directory / "rebuilt.db")
    rebuilt.apply([(s.key, s.value) for s in rig.changelog(0)], offset=None)
    assert rebuilt.request_offset == rig.table(0).request_offset == first.offset + 1
    rebuilt.close()


def test_records_of_a_revoked_partition_are_left_to_its_new_owner(rig):
    rig.ingest(rig.request("mine", T_MS, partition=0), rig.request("theirs", T_MS, partition=1))
    written_for_1 = len(rig.changelog(1))
    rig.owned = {0}  # a rebalance moved partition 1 to another worker
    rig.ingest(rig.request("buffered-theirs", T_MS + 10, partition=1))
    rig.tick(T, partitions=(0, 1))

    assert rig.fired() == ["mine"]  # partition 1's timers fire at its new owner, not here
    # Its tick was not ours to count either: not a duplicate, just not ours.
    assert rig.metrics.ticks.labels("duplicate")._value.get() == 0
    assert len(rig.changelog(1)) == written_for_1  # and its changelog is the new owner's to write
    assert rig.pending_ids(1) == ["theirs"]


def test_tick_fires_exactly_the_timers_due_by_its_second(rig):
    rig.ingest(
        rig.request("early", T_MS - 3000),
        rig.request("on-the-second", T_MS),
        rig.request("half-past", T_MS + 500),
        rig.request("next-second", T_MS + 1000),
    )
    assert rig.table(0).pending == 4
    assert [e.id for e in rig.events(Kind.SCHEDULED)] == [
        "early",
        "on-the-second",
        "half-past",
        "next-second",
    ]

    # Our clock is well past T+0.5 s, but the tick says T: the half-past timer waits.
    rig.tick(T, clock_ms=T_MS + 900)
    assert rig.fired() == ["early", "on-the-second"]
    assert rig.pending_ids() == ["half-past", "next-second"]
    assert rig.table(0).pending == 2
    assert rig.table(0).watermark == T

    rig.tick(T + 1)
    assert rig.fired() == ["early", "on-the-second", "half-past", "next-second"]
    assert rig.pending_ids() == []
    assert rig.table(0).pending == 0
    assert rig.table(0).watermark == T + 1
    assert [e.id for e in rig.events(Kind.FIRED)] == rig.fired()


def test_callback_carries_payload_and_headers(rig):
    rig.ingest(
        rig.request(
            "order-7",
            T_MS + 250,
            key="customer-9",
            payload=b"\x00body",
            token="tok-1",
            headers=(("trace", b"abc"), ("kt-id", b"forged")),
        ),
        rig.request("plain", T_MS + 300, topic="audit"),
    )
    rig.tick(T + 1, clock_ms=(T + 1) * 1000 + 37)

    [cb] = rig.callbacks("orders")
    assert (cb.topic, cb.key, cb.value) == ("orders", b"customer-9", b"\x00body")
    # The user's headers come first, in order; ours follow, so ours win for readers.
    assert cb.headers[:2] == [("trace", b"abc"), ("kt-id", b"forged")]
    assert cb.header("kt-id") == b"order-7"
    assert cb.header("kt-due-ms") == str(T_MS + 250).encode()
    assert cb.header("kt-fired-ms") == str((T + 1) * 1000 + 37).encode()
    assert cb.header("kt-token") == b"tok-1"

    [plain] = rig.callbacks("audit")
    assert plain.header("kt-id") == b"plain"
    assert "kt-token" not in plain.header_names()

    fired = {e.id: e for e in rig.events(Kind.FIRED)}
    assert fired["order-7"].due_ms == T_MS + 250
    assert fired["order-7"].partition == 0


def test_duplicate_and_older_ticks_change_nothing(rig):
    rig.ingest(rig.request("now", T_MS), rig.request("later", T_MS + 5000))
    rig.tick(T)
    sent_before = len(rig.producer.sent)

    rig.tick(T)
    rig.tick(T - 3)
    assert len(rig.producer.sent) == sent_before
    assert rig.table(0).watermark == T
    assert rig.pending_ids() == ["later"]
    assert rig.ticks_counted("duplicate") == 2


def test_ticks_of_several_oscillators_in_one_batch_fire_once(rig):
    rig.ingest(rig.request("a", T_MS + 3000), rig.request("b", T_MS + 5000))
    rig.now = T_MS + 5100
    rig.advance(
        [
            rig.tick_record(T + 5, source="osc-a"),
            rig.tick_record(T + 3, source="osc-c"),  # a lagging oscillator
            rig.tick_record(T + 5, source="osc-b"),
            rig.tick_record(T + 5, source="osc-c"),
        ]
    )
    assert rig.fired() == ["a", "b"]
    assert len(rig.deletions()) == 2
    assert rig.table(0).watermark == T + 5


def test_tick_with_only_a_decimal_key_advances_and_an_invalid_tick_is_ignored(rig):
    rig.ingest(rig.request("a", T_MS + 2000))
    rig.now = T_MS + 2010
    rig.advance([SourceRecord(rig.topics.oscillator, 0, 0, b"not-a-second", None)])
    assert rig.fired() == []
    assert rig.table(0).watermark == -1
    assert rig.ticks_counted("invalid") == 1

    rig.advance([SourceRecord(rig.topics.oscillator, 0, 1, encode_second_key(T + 2), None)])
    assert rig.fired() == ["a"]
    assert rig.table(0).watermark == T + 2


def _early(rig: Rig) -> list[tuple[str, int, int]]:
    """Every callback sent before its due time by the clock of the worker that sent it:
    (id, due epoch ms, clock at send)."""
    return [
        ((cb.header("kt-id") or b"").decode(), int(cb.header("kt-due-ms") or 0), cb.at_ms or 0)
        for cb in rig.callbacks()
        if int(cb.header("kt-due-ms") or 0) > (cb.at_ms or 0)
    ]


async def _handled(rig: Rig) -> None:
    """Let the engine's firing task (:meth:`TimerEngine.run`) do what it was woken for."""
    for _ in range(20):
        await asyncio.sleep(0)
    while rig.lock.locked():
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("join_max_wait_s", [0.0, 60.0])
def test_a_bogus_tick_an_hour_ahead_is_refused_and_real_ticks_fire_on_time(make_rig, join_max_wait_s):
    # Anyone who may write to the oscillator topic can send a tick for any second. The
    # consumer's frontier follows the clock: every request written so far is applied.
    rig = make_rig(join_max_wait_s=join_max_wait_s)
    engine = rig.engine
    due = {f"t{i:03d}": T_MS + (i * 211) % 5000 for i in range(200)}

    async def scenario() -> None:
        rig.now = T_MS - 500
        await engine.ingest([rig.request(timer_id, due_ms) for timer_id, due_ms in due.items()])
        firing = asyncio.create_task(engine.run(poll_s=0.01))
        try:
            for rig.now in range(T_MS - 450, T_MS + 6000, 30):
                rig.frontier.behind[0] = rig.now
                ticks = [rig.tick_record(rig.now // 1000)] if rig.now % 1000 < 30 else []
                if T_MS + 600 <= rig.now < T_MS + 630:
                    ticks.append(rig.tick_record(T + 3600, source="rogue"))
                engine.note_ticks(ticks)
                engine.wake()
                await _handled(rig)
        finally:
            firing.cancel()
        await engine.landed()

    asyncio.run(scenario())
    assert _early(rig) == []
    assert sorted(rig.fired()) == sorted(due)
    # Each on the first real tick at or after its due time (they come within 30 ms of their second).
    seconds = {(cb.header("kt-id") or b"").decode(): (cb.at_ms or 0) // 1000 for cb in rig.callbacks()}
    assert seconds == {timer_id: -(-due_ms // 1000) for timer_id, due_ms in due.items()}
    assert rig.ticks_counted("ahead") == 1
    assert rig.metrics.join_wait_bound._value.get() == 0
    assert rig.table(0).watermark == T + 5
    # No tick was left waiting: the sweep wrote every fired timer's tombstone.
    tombstones = [s for s in rig.changelog(0) if s.key.startswith(TIMER_PREFIX) and s.value is None]  # type: ignore[union-attr]
    assert len(tombstones) == len(due)


@pytest.mark.parametrize("precise", [False, True])
def test_a_tick_ahead_of_the_clock_within_the_tolerance_fires_nothing_before_the_clock_reaches_it(
    tmp_path, precise
):
    rig = WallClockRig(
        tmp_path,
        WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=precise, clock_tolerance_ms=500),
    )
    engine = rig.engine

    async def scenario() -> None:
        while not 550 <= wall_clock_ms() % 1000 < 650:
            await asyncio.sleep(0.005)
        s = wall_clock_ms() // 1000
        due = {"now": s * 1000 + 500, "ahead-150": s * 1000 + 750, "ahead-350": s * 1000 + 950}
        due["on-the-second"] = (s + 1) * 1000
        await engine.ingest([rig.request(timer_id, due_ms) for timer_id, due_ms in due.items()])
        # An oscillator whose clock runs 400 ms fast ticks s + 1 at s.600 by ours.
        firing = asyncio.create_task(engine.run(poll_s=60))
        engine.note_ticks([rig.tick_record(s + 1)])
        engine.wake()
        await asyncio.sleep(max((s + 2) * 1000 + 200 - wall_clock_ms(), 0) / 1000)
        firing.cancel()
        assert sorted(rig.fired()) == sorted(due)
        assert _early(rig) == []
        # Not held back past the second either: the engine woke as its clock reached it.
        assert all((cb.at_ms or 0) - (s + 1) * 1000 < 150 for cb in rig.callbacks())
        assert rig.ticks_counted("ahead") == 0

    try:
        asyncio.run(scenario())
    finally:
        rig.close()


# -- late requests ------------------------------------------------------------


def test_request_due_by_the_watermark_fires_on_arrival(rig):
    rig.tick(T)
    rig.ingest(
        rig.request("on-watermark", T_MS),
        rig.request("just-after", T_MS + 1),
        # Far beyond max_lateness_s, but the default policy still fires it.
        rig.request("hours-late", T_MS - 10 * 3_600_000),
    )
    # Into the table and out again as a tick fires them: in due order, and deleted once delivered.
    assert rig.fired() == ["hours-late", "on-watermark"]
    assert rig.pending_ids() == ["just-after"]
    assert rig.table(0).due_of("on-watermark") is None
    assert rig.table(0).low_ms is None

    rig.tick(T + 1)
    assert rig.fired() == ["hours-late", "on-watermark", "just-after"]


@pytest.mark.parametrize("policy", [LatePolicy.DROP, LatePolicy.DLQ])
def test_too_late_request_is_not_fired_under_drop_or_dlq(make_rig, policy):
    rig = make_rig(late_policy=policy, max_lateness_s=60)
    rig.tick(T)
    rig.now = T_MS + 100
    late = rig.request("too-late", T_MS - 120_000, payload=b"late-body")
    rig.ingest(rig.request("a-bit-late", T_MS - 30_000), late, rig.request("on-time", T_MS + 5_000))

    assert rig.fired() == ["a-bit-late"]  # within max_lateness_s: fires on arrival
    assert rig.pending_ids() == ["on-time"]
    [rejected] = rig.events(Kind.REJECTED)
    assert rejected.id == "too-late"
    assert rejected.reason.startswith("too-late")
    # The timer log tells them in the order they came.
    accepted = [(e.id, e.kind) for e in rig.events() if e.kind in (Kind.SCHEDULED, Kind.REJECTED)]
    assert accepted == [
        ("a-bit-late", Kind.SCHEDULED),
        ("too-late", Kind.REJECTED),
        ("on-time", Kind.SCHEDULED),
    ]
    if policy is LatePolicy.DLQ:
        [dead] = rig.dlq()
        assert (dead.key, dead.value) == (late.key, late.value)
        assert dead.header("kt-reason") == b"too-late"
        assert dead.header("kt-source-offset") == str(late.offset).encode()
    else:
        assert rig.dlq() == []

    rig.tick(T + 300)
    assert rig.fired() == ["a-bit-late", "on-time"]


def test_late_request_hitting_a_transient_error_is_kept_for_the_next_tick(rig):
    rig.tick(T)
    batch = (rig.request("late", T_MS - 1000), rig.request("future", T_MS + 5000))
    rig.producer.fail = lambda topic: transient_error() if topic == "orders" else None
    rig.ingest(*batch)
    # Nothing lost, no crash loop: the late timer waits just past the watermark.
    assert rig.fired() == []
    assert sorted(rig.pending_ids()) == ["future", "late"]

    rig.producer.fail = lambda topic: None
    rig.tick(T + 1)
    assert rig.fired() == ["late"]
    [callback] = rig.callbacks()
    assert callback.header("kt-due-ms") == str(T_MS - 1000).encode()  # its real due time
    assert rig.pending_ids() == ["future"]


def test_a_failed_callback_is_traced_to_its_timer_and_callbacks_alike_share_its_fate(rig):
    # A delivery report names a record, not a timer: the failure is traced by topic, key and value.
    due = {"a": T_MS - 500, "b": T_MS - 400, "c": T_MS - 300, "twin-1": T_MS - 200, "twin-2": T_MS - 100}
    rig.ingest(
        *(
            rig.request(
                i,
                d,
                key="same" if i.startswith("twin") else "",
                payload=b"same" if i.startswith("twin") else None,
            )
            for i, d in due.items()
        )
    )
    delivered: list[str] = []

    def fail(topic: str) -> KafkaError | None:
        if topic != "orders":
            return None
        delivered.append("")
        return transient_error() if len(delivered) in (2, 4) else None  # "b" and "twin-1"

    rig.producer.fail = fail
    rig.tick(T)
    assert sorted(rig.fired()) == ["a", "c", "twin-2"]  # delivered
    # "b" is kept; "twin-2" too, though delivered: nothing in its report tells it from "twin-1".
    assert sorted(rig.pending_ids()) == ["b", "twin-1", "twin-2"]

    rig.producer.fail = lambda topic: None
    rig.tick(T + 1)
    assert sorted(rig.fired()) == ["a", "b", "c", "twin-1", "twin-2", "twin-2"]
    assert rig.pending_ids() == []


# -- reschedule and cancel ----------------------------------------------------


def test_rescheduling_an_id_keeps_only_the_latest_version(rig):
    rig.ingest(rig.request("x", T_MS + 5000, payload=b"v1"))
    rig.ingest(rig.request("x", T_MS + 3000, payload=b"v2"))
    rig.ingest(
        rig.request("x", T_MS + 9000, payload=b"v3"),
        rig.request("y", T_MS + 4000, payload=b"y"),
        rig.request("x", T_MS + 8000, payload=b"v4"),  # same batch: the later record wins
    )
    assert rig.table(0).pending == 2
    assert rig.table(0).due_of("x") == T_MS + 8000

    rig.tick(T + 10)
    assert [cb.value for cb in rig.callbacks()] == [b"y", b"v4"]
    assert rig.table(0).pending == 0


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_a_step_written_in_several_pieces_keeps_only_each_ids_latest_version(make_rig, chunk):
    # Every `chunk` timers a step is written before it goes on: a version staged in a piece
    # written already must be replaced, not fire beside the newer one.
    rig = make_rig(fire_chunk_size=chunk)
    rig.ingest(rig.request("old", T_MS + 2000, payload=b"old-v1"))
    rig.ingest(
        rig.request("x", T_MS + 5000, payload=b"v1"),
        rig.request("y", T_MS + 4000, payload=b"y"),
        rig.request("old", T_MS + 6000, payload=b"old-v2"),
        rig.request("x", T_MS + 3000, payload=b"v2"),
        rig.cancel("y"),
        rig.request("x", T_MS + 7000, payload=b"v3"),
    )
    assert rig.table(0).pending == 2
    rig.tick(T + 10)
    assert [cb.value for cb in rig.callbacks()] == [b"old-v2", b"v3"]
    assert rig.table(0).pending == 0


def test_rescheduling_to_the_same_due_time_replaces_the_payload(rig):
    rig.ingest(rig.request("x", T_MS + 1000, payload=b"v1"))
    rig.ingest(rig.request("x", T_MS + 1000, payload=b"v2"))
    assert rig.table(0).pending == 1
    rig.tick(T + 1)
    assert [cb.value for cb in rig.callbacks()] == [b"v2"]


def test_cancel_removes_a_pending_timer_and_reports_misses(rig):
    rig.ingest(rig.request("a", T_MS + 5000), rig.request("b", T_MS + 6000), rig.request("c", T_MS + 2000))
    rig.ingest(rig.cancel("a"), rig.cancel("nobody"))
    assert rig.table(0).pending == 2
    [cancelled] = rig.events(Kind.CANCELLED)
    assert (cancelled.id, cancelled.due_ms) == ("a", T_MS + 5000)
    assert [e.id for e in rig.events(Kind.CANCEL_MISSED)] == ["nobody"]

    rig.tick(T + 3)
    assert rig.fired() == ["c"]
    rig.ingest(rig.cancel("c"))  # too late: it already fired
    assert [e.id for e in rig.events(Kind.CANCEL_MISSED)] == ["nobody", "c"]

    rig.ingest(rig.request("d", T_MS + 9000), rig.cancel("d"))  # cancelled within its own batch
    assert [e.id for e in rig.events(Kind.CANCELLED)] == ["a", "d"]
    assert rig.table(0).pending == 1

    rig.tick(T + 10)
    assert rig.fired() == ["c", "b"]
    assert rig.table(0).pending == 0


# -- rejections and dead letters ----------------------------------------------


def test_rejected_request_is_dead_lettered_and_the_rest_of_the_batch_scheduled(rig):
    bad = rig.raw_request(b"k-1", b"\x0a\xff", headers=(("trace", b"t-1"),))
    rig.ingest(rig.request("a", T_MS + 1000), bad, rig.request("c", T_MS + 2000))

    [dead] = rig.dlq()
    assert (dead.key, dead.value) == (b"k-1", b"\x0a\xff")
    assert dead.header("trace") == b"t-1"
    assert dead.header("kt-reason") == b"undecodable"
    assert dead.header("kt-error")
    assert dead.header("kt-source-topic") == b"timer-request"
    assert dead.header("kt-source-partition") == b"0"
    assert dead.header("kt-source-offset") == str(bad.offset).encode()

    [event] = rig.events(Kind.REJECTED)
    assert event.id == f"seed-0-{bad.offset}"
    assert event.reason.startswith("undecodable")

    assert rig.table(0).pending == 2
    rig.tick(T + 2)
    assert rig.fired() == ["a", "c"]


def test_records_of_one_future_each_are_applied_in_order_each_timer_with_its_own_record(rig):
    # As the original design's producers send them: a step holds many such records of a
    # partition, read together; a record the general parser judges comes in its place.
    records = [
        rig.request("a", T_MS + 1000),
        rig.request("b", T_MS + 2000),
        rig.request("c", T_MS + 3000, topic="not a topic!"),  # refused: dead-lettered
        rig.request("d", T_MS + 4000),
        rig.cancel("b"),
        rig.request("e", T_MS + 5000, partition=1),
        rig.request("b", T_MS + 6000),  # after its cancel: pending again
        rig.request("a", T_MS + 7000),  # a new version
        rig.request("f", T_MS + 8000),
    ]
    rig.ingest(*records)
    offset = {r.offset: r for r in records if r.partition == 0}
    assert rig.pending_ids() == ["d", "b", "a", "f"]
    assert rig.pending_ids(1) == ["e"]
    assert [e.id for e in rig.events(Kind.CANCELLED)] == ["b"]
    [dead] = rig.dlq()
    assert dead.header("kt-source-offset") == str(records[2].offset).encode()
    scheduled = [(e.id, offset.get(e.source_offset)) for e in rig.events(Kind.SCHEDULED) if e.partition == 0]
    assert scheduled == [
        ("a", records[0]), ("b", records[1]), ("d", records[3]), ("b", records[6]), ("a", records[7]),
        ("f", records[8]),
    ]  # fmt: skip
    assert rig.table(0).request_offset == records[-1].offset
    assert rig.table(1).request_offset == records[5].offset

    rig.tick(T + 10, partitions=(0, 1))
    assert rig.fired() == ["d", "e", "b", "a", "f"]
    fired = {e.id: e.source_offset for e in rig.events(Kind.FIRED)}
    assert fired == {"d": records[3].offset, "e": records[5].offset, "b": records[6].offset,
                     "a": records[7].offset, "f": records[8].offset}  # fmt: skip


def test_permanently_undeliverable_callback_is_dead_lettered_and_others_fire(rig):
    rig.producer.fail = lambda topic: permanent_error() if topic == "gone" else None
    rig.ingest(
        rig.request("a", T_MS - 999),
        rig.request("b", T_MS - 500, topic="gone", payload=b"b-body"),
        rig.request("c", T_MS),
    )
    rig.tick(T)

    assert rig.fired() == ["a", "c"]
    [dead] = rig.dlq()
    future = Future.FromString(dead.value or b"")
    assert (future.id, future.callBackTopic, future.callBack, future.due_ms) == (
        "b",
        "gone",
        b"b-body",
        T_MS - 500,
    )
    assert dead.header("kt-reason") == b"callback-undeliverable"
    assert dead.header("kt-source-partition") == b"0"
    assert [e.id for e in rig.events(Kind.REJECTED)] == ["b"]
    assert rig.table(0).pending == 0
    assert rig.table(0).watermark == T

    rig.tick(T + 1)  # dead-lettered for good: not retried
    assert len(rig.producer.failed("gone")) == 1
    assert len(rig.dlq()) == 1


def test_callback_refused_by_produce_itself_is_dead_lettered_without_stopping_the_tick(rig):
    # librdkafka raises from produce() for a record over message.max.bytes.
    rig.producer.refuse = lambda topic: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if topic == "big" else None
    rig.ingest(
        rig.request("a", T_MS - 10), rig.request("huge", T_MS - 5, topic="big"), rig.request("c", T_MS)
    )
    rig.tick(T)

    assert rig.fired() == ["a", "c"]
    [dead] = rig.dlq()
    assert dead.header("kt-reason") == b"callback-undeliverable"
    assert b"big" in (dead.header("kt-error") or b"")
    assert rig.table(0).pending == 0
    assert rig.table(0).watermark == T


def test_transiently_undeliverable_callback_is_kept_and_retried_on_the_next_tick(rig):
    rig.tick(T - 1)
    flaky = {"orders"}
    rig.producer.fail = lambda topic: transient_error() if topic in flaky else None
    rig.ingest(rig.request("a", T_MS), rig.request("b", T_MS, topic="audit"))

    rig.tick(T)
    assert rig.fired("orders") == []
    assert rig.fired("audit") == ["b"]
    assert rig.pending_ids() == ["a"]
    assert rig.table(0).pending == 1
    assert rig.table(0).watermark == T  # the clock moves on; the kept timer stays below it
    assert rig.table(0).low_ms == T_MS
    assert rig.dlq() == []

    flaky.clear()
    rig.tick(T + 1)
    assert rig.fired("orders") == ["a"]
    assert rig.fired("audit") == ["b"]  # delivered once, not resent with the retry
    assert rig.table(0).pending == 0
    assert rig.table(0).watermark == T + 1


# -- durability ---------------------------------------------------------------


def test_callbacks_are_delivered_before_their_timers_are_deleted(rig):
    rig.ingest(*(rig.request(f"t{i}", T_MS + i) for i in range(5)))
    rig.tick(T + 1)
    flushed_at = {cb.header("kt-id"): cb.flush_no for cb in rig.callbacks()}
    deletions = rig.deletions()
    assert len(deletions) == 5
    for key, record in deletions:
        # Produced after the flush that delivered the callback.
        assert record.flush_no > flushed_at[key[9:]]


def test_undelivered_changelog_leaves_the_table_unchanged(rig):
    changelog = rig.config.changelog_topic
    rig.producer.fail = lambda topic: permanent_error() if topic == changelog else None
    with pytest.raises(DeliveryError):
        asyncio.run(rig.engine.ingest([rig.request("a", T_MS)]))
    assert rig.table(0).pending == 0
    assert rig.table(0).due_of("a") is None

    rig.producer.fail = lambda topic: None
    rig.ingest(rig.request("a", T_MS))
    rig.producer.fail = lambda topic: permanent_error() if topic == changelog else None
    rig.now = T_MS + 10
    with pytest.raises(DeliveryError):
        asyncio.run(rig.fire([rig.tick_record(T)]))
    # The callback went out but its deletion is not durable: the timer stays
    # (it fires again after a restart: at least once, never lost).
    assert rig.fired() == ["a"]
    assert rig.pending_ids() == ["a"]
    assert rig.table(0).watermark == -1


def test_a_changelog_failure_in_the_middle_of_a_hot_second_loses_nothing_and_repeats_within_a_chunk(make_rig):
    # Pieces overlap: when one's changelog write fails, the ones after it were already sent.
    rig = make_rig(fire_chunk_size=300)
    n = 2000
    ids = [f"h{i:05d}" for i in range(n)]
    rig.ingest(*(rig.request(timer_id, T_MS - (i * 7919) % 1000) for i, timer_id in enumerate(ids)))
    changelog = rig.config.changelog_topic
    written = 0

    def fail_midway(topic: str) -> KafkaError | None:
        nonlocal written
        if topic != changelog:
            return None
        written += 1
        return permanent_error() if written > 12 else None  # a piece's records, then its progress

    rig.producer.fail = fail_midway
    rig.now = T_MS + 10
    with pytest.raises(DeliveryError):
        asyncio.run(rig.fire([rig.tick_record(T)]))
    first = rig.fired()
    assert 0 < len(first) < n
    deleted = n - rig.table(0).pending
    assert 0 < deleted <= len(rig.deletions(delivered_only=True))  # only what is durable
    assert rig.table(0).watermark == -1  # the clock did not move

    rig.producer.fail = lambda topic: None
    rig.tick(T)  # the restarted worker's tick
    fired = rig.fired()
    assert sorted(set(fired)) == ids  # none lost
    repeats = len(fired) - n
    assert 0 < repeats <= 300  # sent but not durably deleted: at most one chunk, each once more
    again = fired[len(first) :]
    assert len(again) == len(set(again))  # each once on the restart
    assert rig.table(0).pending == 0 and rig.table(0).watermark == T


def _busy_history(rig: Rig) -> None:
    """Schedules, reschedules, cancels, fires, a transient failure, on two partitions."""
    flaky: set[str] = set()
    rig.producer.fail = lambda topic: transient_error() if topic in flaky else None
    rig.ingest(
        *(rig.request(f"p0-{i}", T_MS + i * 700) for i in range(10)),
        *(rig.request(f"p1-{i}", T_MS + i * 1300, partition=1) for i in range(6)),
        rig.request("x", T_MS + 2500, payload=b"v1"),
    )
    rig.ingest(rig.request("x", T_MS + 6500, payload=b"v2"), rig.cancel("p0-8"), rig.cancel("p1-5", 1))
    rig.tick(T + 2, partitions=(0, 1))
    rig.ingest(rig.request("y", T_MS + 4000, topic="flaky"), rig.request("p0-2", T_MS + 7000))
    flaky.add("flaky")
    rig.tick(T + 4, partitions=(0, 1))
    flaky.clear()
    rig.ingest(rig.request("z", T_MS + 3000), rig.request("p0-9", T_MS + 9000, payload=b"v2"))
    rig.tick(T + 5, partitions=(0, 1))


@pytest.mark.parametrize("profile", [BrokerProfile.CLUSTER, BrokerProfile.EMBEDDED])
def test_every_changelog_write_ends_with_its_partitions_progress_flushed_on_its_own(make_rig, profile):
    rig = make_rig(profile)
    _busy_history(rig)
    for partition in (0, 1):
        records = rig.changelog(partition)
        last_request_offset = rig.last_offset(rig.topics.request, partition)
        assert (records[-1].key, records[-1].value) == progress_record(T + 5, last_request_offset)
    # The progress record acknowledges the requests of its write, so it goes out only once
    # everything the write caused was delivered: in a flush of its own, after the write's.
    by_flush: dict[int, list[Sent]] = defaultdict(list)
    for s in rig.producer.on(rig.config.changelog_topic):
        by_flush[s.flush_no].append(s)
    writes = 0
    for flush_no, records in by_flush.items():
        tails = [s for s in records if s.key == PROGRESS_KEY]
        if tails:
            # A tail batch holds nothing but tails, at most one per partition.
            assert tails == records
            assert len({s.partition for s in tails}) == len(tails)
        else:
            # A write's records are followed, in the next flush, by their partitions' tails.
            writes += 1
            tail_partitions = {s.partition for s in by_flush[flush_no + 1] if s.key == PROGRESS_KEY}
            assert {s.partition for s in records} <= tail_partitions
    assert writes >= 5


def _replay(into: PartitionTimers, batches: list[list[Sent]]) -> None:
    """Apply changelog records as Faust's recovery does: in batches, counting against the table."""
    for batch in batches:
        into.apply([(s.key or b"", s.value) for s in batch], offset=max(s.offset or 0 for s in batch))


def _assert_same_table(live: PartitionTimers, replayed: PartitionTimers, ids: list[str]) -> None:
    assert replayed.watermark == live.watermark
    assert [(d.key, d.value) for d in replayed.iter_pending()] == [
        (d.key, d.value) for d in live.iter_pending()
    ]
    assert replayed.pending == live.pending
    assert replayed.persisted_offset == live.persisted_offset
    for timer_id in ids:
        assert replayed.due_of(timer_id) == live.due_of(timer_id), timer_id


ALL_IDS = [f"p0-{i}" for i in range(10)] + [f"p1-{i}" for i in range(6)] + ["x", "y", "z"]


def test_replaying_the_changelog_write_by_write_rebuilds_the_live_table(rig, tmp_path):
    _busy_history(rig)
    assert rig.table(0).pending > 0 and rig.table(1).pending > 0
    for partition in (0, 1):
        writes: dict[int, list[Sent]] = defaultdict(list)
        for s in rig.changelog(partition):
            writes[s.flush_no].append(s)
        replayed = PartitionTimers(tmp_path / f"replayed-{partition}.db")
        try:
            _replay(replayed, list(writes.values()))
            _assert_same_table(rig.table(partition), replayed, ALL_IDS)
        finally:
            replayed.close()


def test_replaying_the_changelog_in_one_batch_rebuilds_the_live_table(rig, tmp_path):
    _busy_history(rig)
    replayed = PartitionTimers(tmp_path / "replayed.db")
    try:
        _replay(replayed, [rig.changelog(0)])
        _assert_same_table(rig.table(0), replayed, ALL_IDS)
    finally:
        replayed.close()


# -- volume -------------------------------------------------------------------


def test_hot_second_fires_every_timer_once_in_bounded_chunks(make_rig):
    rig = make_rig(fire_chunk_size=1000)
    n = 5000
    rig.ingest(*(rig.request(f"h{i:05d}", T_MS - (i * 7919) % 1000) for i in range(n)))
    assert rig.table(0).pending == n

    rig.tick(T)
    fired = rig.fired()
    assert len(fired) == n
    assert len(set(fired)) == n
    # Never more than one chunk of callbacks in flight between flushes.
    per_flush: dict[int, int] = defaultdict(int)
    for cb in rig.callbacks():
        per_flush[cb.flush_no] += 1
    assert max(per_flush.values()) <= 1000
    # The admin page's newest firings are the last callbacks, newest first, whatever the chunks.
    assert [f.timer_id for f in rig.engine.status.recent_firings(3)] == fired[:-4:-1]
    assert rig.table(0).pending == 0
    assert rig.pending_ids() == []
    assert rig.table(0).watermark == T
    assert len(rig.deletions()) == n


@pytest.mark.parametrize("chunk", [1, 2, 3, 900])
def test_a_hot_second_never_holds_more_than_a_chunk_sent_and_not_yet_deleted(make_rig, monkeypatch, chunk):
    # What is sent and still in the table is what a crash sends again: pieces overlap, but
    # together they stay within TIMERS_FIRE_CHUNK_SIZE.
    n = 3000
    worst = 0
    sent = 0
    produce = FakeProducer.produce

    def counting(self: FakeProducer, topic: str, *args: object, **kwargs: object) -> None:
        nonlocal sent, worst
        produce(self, topic, *args, **kwargs)  # type: ignore[arg-type]
        if topic == "orders":
            sent += 1
            worst = max(worst, sent - (n - rig.table(0).pending))

    monkeypatch.setattr(FakeProducer, "produce", counting)
    rig = make_rig(fire_chunk_size=chunk)
    rig.ingest(*(rig.request(f"h{i:05d}", T_MS - (i * 7919) % 1000) for i in range(n)))
    rig.tick(T)
    assert sorted(rig.fired()) == sorted(f"h{i:05d}" for i in range(n))
    assert rig.table(0).pending == 0
    assert chunk // 2 < worst <= chunk  # within a chunk, and most of it in use


@pytest.mark.parametrize("chunk", [3, 8, 20_000])
def test_one_tick_fires_every_partitions_timers_in_due_order(make_rig, chunk):
    # Fired one partition after another, the last partition's most overdue timers would wait
    # for all the others': its p99 lateness is the time the whole second takes to go out.
    rig = make_rig(fire_chunk_size=chunk)
    due = {f"t{i:02d}": T_MS - (i * 37) % 1000 for i in range(40)}
    rig.ingest(*(rig.request(tid, ms, partition=i % 4) for i, (tid, ms) in enumerate(due.items())))

    rig.tick(T, partitions=(0, 1, 2, 3))
    fired = rig.fired()
    assert sorted(fired) == sorted(due)
    assert [due[tid] for tid in fired] == sorted(due.values())
    assert all(rig.table(p).watermark == T and rig.pending_ids(p) == [] for p in range(4))
    per_flush: dict[int, int] = defaultdict(int)
    for cb in rig.callbacks():
        per_flush[cb.flush_no] += 1
    assert max(per_flush.values()) <= chunk


def test_a_tick_fetched_while_another_partition_fires_joins_that_firing(rig):
    # One second's ticks often come in two fetches: the second fetch's partitions must
    # not wait for the first's firing and commit to end.
    rig.ingest(rig.request("p0", T_MS - 500, partition=0), rig.request("p1", T_MS - 900, partition=1))
    late_tick = rig.tick_record(T, partition=1)

    def fetch_meanwhile(topic: str) -> None:  # the transport fetches while callbacks are delivered
        if topic == "orders":
            rig.engine.note_ticks([late_tick])

    rig.producer.fail = fetch_meanwhile
    rig.now = T_MS + 10
    rig.advance([rig.tick_record(T, partition=0)])
    assert rig.fired() == ["p0", "p1"]  # both in the first call
    assert rig.table(1).watermark == T
    assert rig.ticks_counted("advanced") == 2

    rig.producer.fail = lambda topic: None
    rig.tick(T, partitions=(1,))  # a second oscillator's copy
    assert rig.fired() == ["p0", "p1"]
    assert rig.ticks_counted("duplicate") == 1


async def _run_until(rig: Rig, fired: int, within_s: float) -> float:
    """Run the engine's firing task until ``fired`` callbacks went out; seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    runner = asyncio.create_task(rig.engine.run())
    try:
        async with asyncio.timeout(within_s):
            while len(rig.fired()) < fired:
                await asyncio.sleep(0.001)
    finally:
        runner.cancel()
    return loop.time() - start


def _overdue_in_p0_and_p1(rig: Rig, clocks: tuple[int, ...]) -> None:
    """The clocks of ``clocks`` one second behind; a timer of partition 1 due early in second T,
    one of partition 0 due late in it; the worker's clock just past it."""
    rig.tick(T - 1, partitions=clocks)
    rig.ingest(
        rig.request("late-in-p0", T_MS - 100, partition=0),
        rig.request("early-in-p1", T_MS - 900, partition=1),
    )
    rig.now = T_MS + 10


async def _held_then_released(rig: Rig, ticks: list[SourceRecord], release: Callable[[], object]) -> None:
    """Take ``ticks``: nothing fires while a second's ticks wait for what ``release`` brings (a
    late tick, requests applied); then both timers go at once (not after the bound, 30 s)."""
    rig.engine.note_ticks(ticks)
    rig.engine.wake()
    runner = asyncio.create_task(_run_until(rig, 2, within_s=10))
    await asyncio.sleep(0.05)
    assert rig.fired() == []
    release()
    rig.engine.wake()
    await runner


def test_a_seconds_ticks_fetched_apart_fire_as_one_stream_in_due_order(rig, monkeypatch):
    # A fetch may bring some partitions' ticks of a second and the next fetch the rest: fired
    # at once, the first ones' firing would make the others' most overdue timers wait for it.
    monkeypatch.setattr(engine_module, "TICK_GATHER_S", 30.0)
    _overdue_in_p0_and_p1(rig, clocks=(0, 1, 2, 3))
    asyncio.run(
        _held_then_released(
            rig,
            [rig.tick_record(T, partition=0), rig.tick_record(T, partition=3)],
            lambda: rig.engine.note_ticks([rig.tick_record(T, partition=1), rig.tick_record(T, partition=2)]),
        )
    )
    assert rig.fired() == ["early-in-p1", "late-in-p0"]
    assert all(rig.table(p).watermark == T for p in range(4))


def test_a_partition_whose_tick_does_not_come_delays_the_others_once_and_briefly(rig, monkeypatch):
    gather_s = 0.3
    monkeypatch.setattr(engine_module, "TICK_GATHER_S", gather_s)
    rig.tick(T - 1, partitions=(0, 1))
    rig.ingest(rig.request("first", T_MS - 100), rig.request("next", T_MS + 900))

    async def partition_1_silent() -> tuple[float, float]:
        rig.now = T_MS + 10
        rig.engine.note_ticks([rig.tick_record(T, partition=0)])
        rig.engine.wake()
        waited = await _run_until(rig, 1, within_s=10)
        rig.now = T_MS + 1010
        rig.engine.note_ticks([rig.tick_record(T + 1, partition=0)])
        rig.engine.wake()
        return waited, await _run_until(rig, 2, within_s=10)

    waited, then = asyncio.run(partition_1_silent())
    assert rig.fired() == ["first", "next"]
    assert gather_s * 0.9 <= waited < 5  # waited for partition 1's tick, boundedly
    assert then < gather_s  # one second behind no more: not waited for again
    assert rig.table(1).watermark == T - 1


def test_a_tick_held_by_requests_written_just_before_it_fires_with_the_others_in_due_order(rig, monkeypatch):
    # Fired without it, partition 1 would wait for the others' whole firing: the ingest step
    # that applies its requests needs the engine lock that firing holds.
    monkeypatch.setattr(engine_module, "JOIN_GATHER_S", 30.0)
    _overdue_in_p0_and_p1(rig, clocks=(0, 1))
    rig.frontier.behind[1] = T_MS - 20  # a request written 20 ms before the tick is still to apply
    asyncio.run(
        _held_then_released(
            rig,
            [rig.tick_record(T, partition=0), rig.tick_record(T, partition=1)],
            lambda: rig.frontier.behind.pop(1),  # the ingest step applied them
        )
    )
    assert rig.fired() == ["early-in-p1", "late-in-p0"]
    assert rig.table(0).watermark == rig.table(1).watermark == T


@pytest.mark.parametrize(("behind_ms", "delayed"), [(20, True), (3000, False)])
def test_a_tick_held_by_requests_delays_the_others_boundedly_and_only_if_just_behind(
    rig, monkeypatch, behind_ms, delayed
):
    # Just behind (the next ingest step's requests): the others wait for it, at most
    # JOIN_GATHER_S. Behind by a backlog: they fire at once.
    join_gather_s = 0.3
    monkeypatch.setattr(engine_module, "JOIN_GATHER_S", join_gather_s)
    _overdue_in_p0_and_p1(rig, clocks=(0, 1))
    rig.frontier.behind[1] = T_MS - behind_ms  # and stays there

    async def held() -> float:
        rig.engine.note_ticks([rig.tick_record(T, partition=0), rig.tick_record(T, partition=1)])
        rig.engine.wake()
        return await _run_until(rig, 1, within_s=10)

    waited = asyncio.run(held())
    assert rig.fired() == ["late-in-p0"]
    assert rig.table(1).watermark < T  # its tick still waits for its requests
    if delayed:
        assert join_gather_s * 0.9 <= waited < 5
    else:
        assert waited < join_gather_s / 2


def test_a_tick_waits_for_the_requests_written_before_it(rig):
    # The worker is behind: requests written before the tick are fetched but not applied yet.
    # The cancel and the new version among them win; the tick fires once they are applied.
    rig.ingest(rig.request("cancelled", T_MS - 500), rig.request("moved", T_MS - 400))
    rig.frontier.behind[0] = T_MS - 3000  # the oldest request still to apply: 3 s before the tick
    rig.tick(T)
    assert rig.fired() == []
    assert rig.table(0).watermark < T

    rig.ingest(rig.cancel("cancelled"), rig.request("moved", T_MS + 5000))
    del rig.frontier.behind[0]  # all applied
    rig.fire_ready()
    assert rig.fired() == []
    assert rig.table(0).watermark == T
    assert rig.pending_ids() == ["moved"]
    assert [e.id for e in rig.events(Kind.CANCELLED)] == ["cancelled"]
    assert rig.events(Kind.CANCEL_MISSED) == []
    assert rig.metrics.registry.get_sample_value("timers_join_wait_seconds_count") == 1


def test_a_waiting_tick_fires_what_is_due_before_its_oldest_unapplied_request(rig):
    rig.ingest(rig.request("early", T_MS - 2500), rig.request("late", T_MS - 500))
    rig.frontier.behind[0] = T_MS - 1500  # requests up to 1.5 s before the tick are applied
    rig.tick(T)
    assert rig.fired() == ["early"]
    assert rig.table(0).watermark == T - 2

    del rig.frontier.behind[0]
    rig.fire_ready()
    assert rig.fired() == ["early", "late"]
    assert rig.table(0).watermark == T


def test_a_tick_that_waited_past_the_bound_fires_without_the_older_requests(make_rig):
    rig = make_rig(join_max_wait_s=0)
    rig.ingest(rig.request("due", T_MS - 500))
    rig.frontier.behind[0] = T_MS - 3000
    rig.tick(T)
    assert rig.fired() == ["due"]
    assert rig.metrics.registry.get_sample_value("timers_join_wait_bound_total") == 1


def test_ticks_of_a_partition_revoked_while_waiting_are_forgotten(rig):
    rig.ingest(rig.request("due", T_MS - 500))
    rig.frontier.behind[0] = T_MS - 3000
    rig.tick(T)
    rig.owned = {1, 2, 3}
    rig.fire_ready()
    rig.owned = {0, 1, 2, 3}  # handed back: only a new tick moves its clock
    del rig.frontier.behind[0]
    rig.fire_ready()
    assert rig.fired() == []
    rig.tick(T + 1)
    assert rig.fired() == ["due"]


def test_timers_stuck_on_a_flaky_topic_do_not_starve_the_rest(make_rig):
    rig = make_rig(fire_chunk_size=2)
    rig.producer.fail = lambda topic: transient_error() if topic == "flaky" else None
    rig.ingest(
        rig.request("s1", T_MS - 900, topic="flaky"),
        rig.request("s2", T_MS - 800, topic="flaky"),
        rig.request("ok", T_MS),
    )
    for second in range(T, T + 3):
        rig.tick(second)
    assert rig.fired() == ["ok"]
    assert rig.pending_ids() == ["s1", "s2"]  # still kept for a retry, below the clock
    assert rig.table(0).watermark == T + 2
    assert rig.table(0).low_ms == T_MS - 900


class FakeGapReader:
    """Serves request records back by offset, as the broker would."""

    def __init__(self, records: list[SourceRecord]) -> None:
        self.records = records
        self.reads: list[tuple[int, int]] = []

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        self.reads.append((start, end))
        return [r for r in self.records if r.partition == partition and start <= r.offset < end]


def test_requests_the_stream_skipped_are_read_back_and_applied_in_order(rig):
    # Faust can ack records it never delivered (during a rebalance) and read on:
    # the engine sees the hole in the offsets and reads the missing ones itself.
    first, skipped_1, skipped_2 = rig.request("a", T_MS), rig.request("b", T_MS + 1), rig.cancel("a")
    after = rig.request("c", T_MS + 2)
    gaps = FakeGapReader([first, skipped_1, skipped_2, after])
    rig.engine = TimerEngine(
        rig.config,
        rig.table,
        KafkaWriter(rig.producer),
        rig.metrics,
        clock=lambda: rig.now,
        owns=lambda partition: partition in rig.owned,
        gaps=gaps,
    )
    rig.ingest(first)
    rig.ingest(after)

    assert gaps.reads == [(first.offset + 1, after.offset)]
    assert rig.metrics.requests_read_back._value.get() == 2
    # Applied in log order: the cancel of "a" came after "a" was scheduled.
    assert rig.pending_ids() == ["b", "c"]
    assert rig.table(0).request_offset == after.offset
    rig.ingest(after)  # and nothing is read back for a record already applied
    assert gaps.reads == [(first.offset + 1, after.offset)]


class ReadPastRuns:
    """Stands for the consumer: the runs of offsets it read past without a record."""

    def __init__(self, *runs: tuple[int, int]) -> None:
        self.runs = runs

    def holds_no_request(self, topic: str, partition: int, start: int, end: int) -> bool:
        return any(s <= start and end <= e for s, e in self.runs)


def test_a_hole_the_consumer_read_past_is_not_read_back_and_one_it_did_not_is_read_back_whole(rig):
    # Offsets 1 and 3 hold transaction markers the consumer read past; offset 5 a request it
    # was never handed (Faust dropped it during a rebalance).
    first, marker_1, second, marker_2, third, dropped, fourth = (
        rig.request(timer_id, T_MS) for timer_id in ("a", "marker-1", "b", "marker-2", "c", "dropped", "d")
    )
    assert (marker_1.offset, marker_2.offset, dropped.offset) == (1, 3, 5)
    gaps = FakeGapReader([first, second, third, dropped, fourth])
    rig.engine = TimerEngine(
        rig.config,
        rig.table,
        KafkaWriter(rig.producer),
        rig.metrics,
        clock=lambda: rig.now,
        gaps=gaps,
        read_past=ReadPastRuns((1, 2), (3, 4)),
    )
    rig.ingest(first, second)
    rig.ingest(third, fourth)

    assert gaps.reads == [(dropped.offset, fourth.offset)]
    assert rig.metrics.request_gaps.labels("no-request")._value.get() == 2
    assert rig.metrics.request_gaps.labels("read-back")._value.get() == 1
    assert rig.pending_ids() == ["a", "b", "c", "d", "dropped"]


def test_a_tick_asks_the_topic_directory_once_per_callback_topic_not_once_per_timer(rig):
    rig.ingest(*(rig.request(f"t{n}", T_MS + n, topic="orders" if n % 2 else "audit") for n in range(40)))
    rig.callback_topics.asked.clear()
    rig.tick(T + 1)
    assert len(rig.fired("orders")) == len(rig.fired("audit")) == 20
    assert sorted(rig.callback_topics.asked) == ["audit", "orders"]


def test_a_callback_topic_is_looked_up_when_its_first_timer_is_accepted_not_when_it_fires(rig):
    rig.ingest(rig.request("a", T_MS + 10, topic="audit"), rig.request("b", T_MS + 20, topic="audit"))
    assert rig.callback_topics.asked == ["audit"]  # once, ahead of the tick that fires them


# -- the next second's callbacks, prepared between ticks ----------------------------


def _tick_and_prepare(rig: Rig, second: int, partitions: tuple[int, ...] = (0,)) -> None:
    """A tick, then the wait between ticks in which the engine prepares the next second."""
    rig.now = max(rig.now, second * 1000 + 10)

    async def run() -> None:
        await rig.fire([rig.tick_record(second, p) for p in partitions])
        await rig.between_ticks()

    asyncio.run(run())


def test_callbacks_prepared_before_their_tick_go_out_as_the_table_holds_them_at_the_tick(rig):
    rig.ingest(
        rig.request("replaced", T_MS + 500, payload=b"v1"),
        rig.request("cancelled", T_MS + 600),
        rig.request("kept", T_MS + 700, payload=b"kept"),
        rig.request("later", T_MS + 1500),
    )
    _tick_and_prepare(rig, T)
    assert len(rig.engine._lookahead) == 3  # the timers due by T + 1, not "later"
    # Between the ticks: a new version under the same key, a cancel, a new timer.
    rig.ingest(
        rig.request("replaced", T_MS + 500, payload=b"v2"),
        rig.cancel("cancelled"),
        rig.request("new", T_MS + 800, payload=b"new"),
    )
    _tick_and_prepare(rig, T + 1)
    assert [(cb.header("kt-id"), cb.value) for cb in rig.callbacks()] == [
        (b"replaced", b"v2"),
        (b"kept", b"kept"),
        (b"new", b"new"),
    ]
    assert rig.callbacks()[0].header("kt-fired-ms") == str((T + 1) * 1000 + 10).encode()
    # Nothing prepared is kept past its tick: what is held now is T + 2's ("later").
    assert len(rig.engine._lookahead) == 1
    rig.tick(T + 2)
    assert rig.fired() == ["replaced", "kept", "new", "later"]


def test_no_more_bytes_are_built_ahead_than_the_budget_allows_and_the_rest_fire_too(make_rig):
    budget = 1024 * 1024  # half of it for callbacks built ahead: about eight of 60 KB
    rig = make_rig(fire_budget_bytes=budget)
    due = {f"t{i:02d}": T_MS + 1 + (i * 37) % 999 for i in range(25)}
    rig.ingest(
        *(
            rig.request(tid, ms, partition=i % 2, payload=b"p" * 60_000)
            for i, (tid, ms) in enumerate(due.items())
        )
    )
    _tick_and_prepare(rig, T, partitions=(0, 1))
    lookahead = rig.engine._lookahead
    assert 1 <= len(lookahead) < 25
    assert lookahead.held <= budget // 2 + 2 * 121_000  # may pass its share by the last callback
    _tick_and_prepare(rig, T + 1, partitions=(0, 1))
    fired = rig.fired()
    assert sorted(fired) == sorted(due)
    assert [due[tid] for tid in fired] == sorted(due.values())
    assert len(rig.engine._lookahead) == 0
    assert lookahead.held == 0  # what it held is given back as its callbacks go out


def test_what_was_prepared_for_a_partition_that_went_elsewhere_is_dropped(rig):
    rig.ingest(rig.request("mine", T_MS + 500, partition=0), rig.request("theirs", T_MS + 500, partition=1))
    _tick_and_prepare(rig, T, partitions=(0, 1))
    assert len(rig.engine._lookahead) == 2
    rig.owned = {0}  # a rebalance moved partition 1 to another worker
    _tick_and_prepare(rig, T + 1, partitions=(0,))
    assert rig.fired() == ["mine"]
    assert len(rig.engine._lookahead) == 0
    assert rig.engine._lookahead.held == 0


def test_a_hot_second_over_several_partitions_goes_out_in_whole_pieces(make_rig):
    # Each piece waits for the broker (its callbacks, then its tombstones): a second of
    # 12,000 timers in pieces of 1,000 is a dozen pieces, not dozens of leftovers.
    rig = make_rig(fire_chunk_size=3000)
    due = {f"h{i:05d}": T_MS - (i * 7919) % 1000 for i in range(12_000)}
    rig.ingest(*(rig.request(tid, ms, partition=i % 4) for i, (tid, ms) in enumerate(due.items())))
    writes_before = len([s for s in rig.changelog(0) if s.key == PROGRESS_KEY])
    rig.tick(T, partitions=(0, 1, 2, 3))
    assert sorted(rig.fired()) == sorted(due)
    # A piece is made durable by a changelog write of its own, closed by the progress record.
    writes = len([s for s in rig.changelog(0) if s.key == PROGRESS_KEY]) - writes_before
    assert writes <= 14


# -- the fire path's edge cases ---------------------------------------------------


def test_a_late_timer_replaced_in_its_step_leaves_one_version_even_when_its_callback_fails(rig):
    rig.tick(T)
    rig.producer.fail = lambda topic: transient_error() if topic == "orders" else None
    rig.ingest(rig.request("x", T_MS - 1000, payload=b"v1"), rig.request("x", T_MS + 5000, payload=b"v2"))
    rig.producer.fail = lambda topic: None
    assert rig.pending_ids() == ["x"]  # one version: the latest
    assert rig.table(0).due_of("x") == T_MS + 5000

    rig.ingest(rig.cancel("x"))
    assert [e.id for e in rig.events(Kind.CANCELLED)] == ["x"]
    for second in range(T + 1, T + 7):
        rig.tick(second)
    assert rig.fired() == []
    assert rig.table(0).pending == 0


def test_a_request_read_again_after_a_crash_between_its_step_and_its_progress_fires_once(rig, make_rig):
    # The step's changelog records are written, its progress record is not: the worker dies.
    rig.tick(T)
    request = rig.request("once", T_MS + 1500)
    rig.ingest(request)
    written = [s for s in rig.changelog() if s.key != PROGRESS_KEY]
    restarted = make_rig()
    _replay(restarted.table(0), [written])
    assert restarted.pending_ids() == ["once"]
    assert restarted.table(0).request_offset < request.offset  # so the request is read again

    # After the restart, the tick comes while the request is read again, not yet applied.
    restarted.frontier.behind[0] = T_MS  # the re-read request was written before the tick
    restarted.tick(T + 2)
    assert restarted.fired() == []
    restarted.ingest(request)
    del restarted.frontier.behind[0]
    restarted.fire_ready()
    restarted.tick(T + 3)
    assert restarted.fired() == ["once"]


def test_an_inherited_clock_ahead_of_this_workers_fires_nothing_early(rig):
    # The previous owner's clock ran 5 s fast: the partition's clock is at T + 5.
    rig.tick(T + 5, clock_ms=T_MS + 5010)
    rig.now = T_MS + 100  # this worker's clock
    rig.ingest(rig.request("soon", T_MS + 2000), rig.request("past", T_MS - 1000))
    assert rig.fired() == ["past"]  # due by this worker's clock
    assert rig.pending_ids() == ["soon"]

    rig.now = T_MS + 6010
    rig.tick(T + 6)
    assert rig.fired() == ["past", "soon"]
    callback = rig.callbacks()[-1]
    assert int(callback.header("kt-fired-ms") or b"0") >= T_MS + 2000


def test_a_partition_revoked_while_its_second_fires_sends_nothing_more(make_rig):
    rig = make_rig(fire_chunk_size=300)
    rig.ingest(*(rig.request(f"h{i:04d}", T_MS - 900 + i % 800) for i in range(3000)))
    sent_at_revocation: list[int] = []

    def revoke_midway(topic: str) -> None:
        if topic == "orders" and not sent_at_revocation and len(rig.callbacks()) >= 500:
            rig.owned = {1, 2, 3}
            rig.engine.revoke([0])
            sent_at_revocation.append(len(rig.callbacks()))

    rig.producer.fail = revoke_midway
    rig.tick(T)
    [sent] = sent_at_revocation
    # What was on its way still goes (at least once: the new owner fires it again); no more.
    assert len(rig.callbacks()) <= sent + 300
    assert len(rig.fired()) < 3000


def test_a_revocation_settles_once_the_firing_under_way_has_recorded_what_it_sent(make_rig):
    # The new owner rebuilds the table from the changelog once the group rejoins: every
    # callback sent before the revocation must be deleted there by then, or it goes out twice.
    rig = make_rig(fire_chunk_size=300)
    rig.ingest(*(rig.request(f"h{i:04d}", T_MS - 900 + i % 800) for i in range(3000)))
    rig.now = T_MS + 10

    def produced() -> int:
        return sum(1 for s in rig.producer.sent if s.topic == "orders")

    async def scenario() -> tuple[int, set[bytes]]:
        rig.producer.hold = True  # the broker is slow to acknowledge
        firing = asyncio.ensure_future(rig.fire([rig.tick_record(T)]))
        while produced() < 200:  # two pieces out, the first awaiting its reports
            await asyncio.sleep(0.001)
        rig.owned = {1, 2, 3}
        rig.engine.revoke([0])
        settling = asyncio.ensure_future(rig.engine.settle_revoked())
        await asyncio.sleep(0.05)
        assert not settling.done(), "settled while callbacks sent were not yet recorded"
        rig.producer.hold = False
        await settling
        recorded = {key for key, _ in rig.deletions(0, delivered_only=True)}
        await firing
        return len(rig.callbacks()), recorded

    sent, recorded = asyncio.run(scenario())
    assert 200 <= sent < 3000
    assert len(recorded) == sent
    assert len(rig.pending_ids()) == 3000 - sent


def test_a_partition_handed_back_after_a_revocation_mid_firing_fires_what_it_did_not_send(make_rig):
    # An eager rebalance revokes every partition, then may hand one straight back to the same
    # worker: its table stays open, with the timers the interrupted firing did not send.
    rig = make_rig(fire_chunk_size=300)
    rig.ingest(*(rig.request(f"h{i:04d}", T_MS - 900 + i % 800) for i in range(3000)))

    def revoke_midway(topic: str) -> None:
        if topic == "orders" and 0 in rig.owned and len(rig.callbacks()) >= 500:
            rig.owned = {1, 2, 3}
            rig.engine.revoke([0])

    rig.producer.fail = revoke_midway
    rig.tick(T)
    assert len(set(rig.fired())) < 3000
    rig.producer.fail = lambda topic: None
    rig.owned = {0, 1, 2, 3}  # handed back
    rig.tick(T + 1)
    assert set(rig.fired()) == {f"h{i:04d}" for i in range(3000)}
    assert rig.pending_ids() == []


def _most_unconfirmed(rig: Rig, topic: str = "orders") -> Callable[[], int]:
    """Watch the callbacks ``rig``'s producer holds sent and not yet confirmed: the most bytes
    of their values at any moment (call the returned function to read it). Their reports come
    when the engine waits for them (a flush), not as they are produced, so the most is what the
    producer holds as a flush begins."""
    most = 0
    producer = rig.producer
    flush = producer.flush
    flushing = False

    def flushed(timeout: float = -1.0) -> int:
        nonlocal flushing, most
        held = sum(len(sent.value or b"") for sent, _ in producer._queue if sent.topic == topic)
        most = max(most, held)
        flushing = True
        try:
            return flush(timeout)
        finally:
            flushing = False

    producer.flush = flushed  # type: ignore[method-assign]
    producer.hold_if = lambda sent: sent.topic == topic and not flushing
    return lambda: most


def test_a_firing_of_the_largest_timers_holds_no_more_unconfirmed_bytes_than_its_share(make_rig):
    budget = 3 * 1024 * 1024  # second mode: half of it, about 1.5 MB, for a firing
    rig = make_rig(fire_budget_bytes=budget)
    share = rig.engine._ctx.budget.firing
    payload = rig.config.max_payload_bytes - 2_000  # the largest a request may carry, with its id and key
    due = {f"big-{i:02d}": T_MS - 900 + 50 * i for i in range(16)}
    rig.ingest(
        *(
            rig.request(timer_id, due_ms, partition=i % 4, payload=bytes([i]) * payload)
            for i, (timer_id, due_ms) in enumerate(due.items())
        )
    )
    most = _most_unconfirmed(rig)
    rig.tick(T, partitions=(0, 1, 2, 3))
    assert sorted(rig.fired()) == sorted(due)
    assert most() <= share, f"{most():,} bytes unconfirmed against a share of {share:,}"


def test_a_tick_waiting_for_its_requests_fires_as_the_fetch_response_that_frees_it_comes(rig):
    rig.ingest(rig.request("due", T_MS - 100))
    rig.now = T_MS + 20

    async def scenario() -> None:
        firing = asyncio.create_task(rig.engine.run(poll_s=60))  # no poll in this test's time
        rig.frontier.behind[0] = T_MS - 50  # a request written just before the tick is unread
        rig.engine.note_ticks([rig.tick_record(T)])
        rig.engine.wake()
        await _handled(rig)
        assert rig.fired() == []
        del rig.frontier.behind[0]  # the next fetch response says every request is applied
        rig.engine.frontier_moved()
        await _handled(rig)
        firing.cancel()

    asyncio.run(scenario())
    assert rig.fired() == ["due"]
