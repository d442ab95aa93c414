"""Hostile input at the engine: every record is dead-lettered or applied, and firing goes on.

The parsers' side of it (any bytes give a schedule, a cancel or a reason) is
fuzzed in tests/ingress/test_fuzz.py; here the records that come out of a
rejection must be deliverable, bounded and counted, and one bad callback topic
must not hold the others back.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from futures.ingress.records import SourceRecord
from futures.worker.table import PartitionTimers, table_key
from ktimers.deadletter import H_ORIGINAL_SIZE, H_TRUNCATED, MAX_DETAIL_CHARS
from ktimers.errors import DeliveryError
from ktimers.wire import H_ELEMENT_COUNT, H_INVALID_COUNT, Future, FutureBatch, TimerEvent
from tests.protobuf_bytes import UNKNOWN_FIELDS, nested_groups, unknown_fields_future
from tests.worker.fakes import permanent_error
from tests.worker.rig import T_MS, Rig, T, new_rig

Kind = TimerEvent.Kind


def _size(sent) -> int:
    return (
        len(sent.key or b"")
        + len(sent.value or b"")
        + sum(len(k.encode()) + len(v or b"") for k, v in sent.headers)
    )


@pytest.mark.parametrize(
    ("key_size", "cut"),
    [(10, {"value"}), (200_000, {"key"})],
    ids=["long value", "long key"],
)
def test_an_undecodable_record_near_the_size_limit_is_dead_lettered_cut_down_and_firing_goes_on(
    rig: Rig, key_size: int, cut: set[str]
):
    limit = rig.config.max_record_bytes
    key = b"k" * key_size
    garbage = b"\xff" * (limit - key_size - 1100)  # with the dead-letter headers it would not fit
    headers = (("user-header", b"v" * 1000),)
    rig.ingest(rig.raw_request(key, garbage, headers), rig.request("ok", T_MS - 10))
    rig.tick(T)

    assert rig.fired() == ["ok"]
    (letter,) = rig.dlq()
    assert letter.header("kt-reason") == b"undecodable"
    assert _size(letter) <= limit
    assert set((letter.header(H_TRUNCATED) or b"").decode().split(",")) == cut
    assert int(letter.header(H_ORIGINAL_SIZE) or 0) == key_size + len(garbage) + len("user-header") + 1000
    assert (letter.value or b"") == garbage[: len(letter.value or b"")]  # a prefix of what was sent
    assert (letter.key or b"") == key[: len(letter.key or b"")]
    assert letter.header("user-header") == b"v" * 1000
    assert len((letter.header("kt-error") or b"").decode()) <= MAX_DETAIL_CHARS


def test_a_record_that_fits_is_dead_lettered_whole(rig: Rig):
    rig.ingest(rig.raw_request(b"key", b"\xff\xfe not a future", (("trace", b"1"),)))
    (letter,) = rig.dlq()
    assert (letter.key, letter.value) == (b"key", b"\xff\xfe not a future")
    assert letter.header("trace") == b"1"
    assert letter.header(H_TRUNCATED) is None


def test_a_header_key_that_is_not_utf8_is_dead_lettered_as_escaped_text(rig: Rig):
    # What futures/worker/fetch.py hands on for a header key b"\xff\xfe" (surrogateescape).
    bad_key = b"\xff\xfe".decode("utf-8", "surrogateescape")
    rig.ingest(rig.raw_request(b"k", b"\xff garbage", ((bad_key, b"x"),)))
    (letter,) = rig.dlq()
    assert ("\\xff\\xfe", b"x") in letter.headers


def test_a_timer_over_the_stored_size_limit_is_refused_at_ingest_not_lost_later(make_rig):
    rig = make_rig(max_payload_bytes=10_000)
    rig.ingest(rig.request("big", T_MS - 10, payload=b"x" * 9_990), rig.request("small", T_MS - 10))
    rig.tick(T)
    assert rig.fired() == ["small"]
    (letter,) = rig.dlq()
    assert letter.header("kt-reason") == b"payload-too-large"
    rejected = rig.events(Kind.REJECTED)
    assert [e.id for e in rejected] == ["big"]
    assert [e.id for e in rig.events(Kind.SCHEDULED)] == ["small"]


def test_a_callback_topic_being_looked_up_waits_for_the_next_tick_and_holds_back_nobody(rig: Rig):
    rig.callback_topics.problems["new-topic"] = KafkaError(
        KafkaError._UNKNOWN_TOPIC, "looking up", retriable=True
    )
    rig.ingest(
        rig.request("a", T_MS - 100), rig.request("b", T_MS - 50, topic="new-topic"), rig.request("c", T_MS)
    )
    rig.tick(T)
    assert rig.fired() == ["a", "c"]
    assert rig.pending_ids() == ["b"]
    assert rig.callbacks("new-topic") == []

    del rig.callback_topics.problems["new-topic"]  # the lookup found it
    rig.tick(T + 1)
    assert rig.fired("new-topic") == ["b"]
    assert rig.pending_ids() == []
    assert rig.dlq() == []


def test_a_callback_topic_that_does_not_exist_is_dead_lettered_and_the_rest_fire(rig: Rig):
    rig.callback_topics.problems["gone"] = KafkaError(
        KafkaError.UNKNOWN_TOPIC_OR_PART, "topic 'gone' does not exist"
    )
    rig.ingest(rig.request("a", T_MS - 100), rig.request("lost", T_MS - 50, topic="gone"))
    rig.tick(T)
    assert rig.fired() == ["a"]
    (letter,) = rig.dlq()
    assert letter.header("kt-reason") == b"callback-undeliverable"
    assert b"does not exist" in (letter.header("kt-error") or b"")
    assert Future.FromString(letter.value or b"").id == "lost"  # resendable as it was
    assert rig.pending_ids() == []


def test_a_flood_of_bad_records_logs_a_few_lines_and_counts_them_all(
    rig: Rig, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.WARNING, logger="futures.worker.engine"):
        rig.ingest(*(rig.raw_request(b"k", b"\xff" * 10) for _ in range(500)), rig.request("ok", T_MS))
    rejections = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert 1 <= len(rejections) <= 10
    assert rig.metrics.registry.get_sample_value("timers_rejected_total", {"reason": "undecodable"}) == 500
    assert len(rig.dlq()) == 500
    rig.tick(T)
    assert rig.fired() == ["ok"]


def _batch(rig: Rig, futures: list[Future]):
    value = FutureBatch(futures=futures).SerializeToString()
    return rig.raw_request(b"batch", value, (("kt-kind", b"batch"),))


def test_a_batch_of_many_bad_timers_is_one_dead_letter_and_its_good_timers_fire(rig: Rig, caplog):
    good = [Future(id=f"g{i}", callBackTopic="orders", callBack=b"x", due_ms=T_MS - 10) for i in range(3)]
    bad = [Future() for _ in range(50_000)]  # no due_ms, no topic
    with caplog.at_level(logging.WARNING, logger="futures.worker.engine"):
        rig.ingest(_batch(rig, [*good[:1], *bad, *good[1:]]))
    rig.tick(T)

    assert sorted(rig.fired()) == ["g0", "g1", "g2"]
    (letter,) = rig.dlq()
    assert letter.header("kt-reason") == b"batch-invalid"
    assert (letter.header(H_INVALID_COUNT), letter.header(H_ELEMENT_COUNT)) == (b"50000", b"50003")
    assert b"bad-due-time x50000" in (letter.header("kt-error") or b"")
    assert letter.value == FutureBatch(futures=[*good[:1], *bad, *good[1:]]).SerializeToString()
    assert len(rig.events(Kind.REJECTED)) == 1
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 1


def test_a_batch_with_a_few_bad_timers_dead_letters_each_alone(rig: Rig):
    futures = [Future(id=f"g{i}", callBackTopic="orders", due_ms=T_MS - 10) for i in range(3)]
    futures += [Future(id=f"b{i}", callBackTopic="orders") for i in range(10)]  # at the bound: one by one
    rig.ingest(_batch(rig, futures))
    assert sorted(Future.FromString(d.value or b"").id for d in rig.dlq()) == sorted(
        f"b{i}" for i in range(10)
    )
    assert {d.header("kt-reason") for d in rig.dlq()} == {b"bad-due-time"}


@pytest.mark.parametrize("failing", ["dead letter", "event"])
def test_a_request_whose_dead_letter_or_event_was_not_delivered_is_read_again_after_a_restart(
    rig: Rig, tmp_path: Path, failing: str
):
    topic = rig.topics.dlq if failing == "dead letter" else rig.topics.events
    rig.ingest(rig.request("before", T_MS + 5000))
    bad = rig.raw_request(b"k", b"\xff not a future")
    rig.producer.fail = lambda t: permanent_error() if t == topic else None
    with pytest.raises(DeliveryError):
        asyncio.run(rig.engine.ingest([bad]))

    # A restart recovers the table from the changelog as delivered: the bad record was not
    # acknowledged, so it is read again and dead-lettered then, not skipped as applied.
    rebuilt = PartitionTimers(tmp_path / "rebuilt.db")
    try:
        rebuilt.apply([(s.key or b"", s.value) for s in rig.changelog(0) if s.delivered], offset=None)
        assert rebuilt.request_offset == bad.offset - 1
    finally:
        rebuilt.close()
    rig.producer.fail = lambda t: None
    rig.ingest(bad)
    # At least once: a dead letter delivered before its event failed is written again.
    letters = [s.header("kt-reason") for s in rig.dlq() if s.delivered]
    assert letters == [b"undecodable"] * (1 if failing == "dead letter" else 2)


def test_a_timer_whose_callback_and_dead_letter_both_fail_is_not_deleted(rig: Rig, tmp_path: Path):
    rig.ingest(rig.request("gone-1", T_MS, topic="gone"), rig.request("ok", T_MS))
    rig.producer.fail = lambda t: permanent_error() if t in ("gone", rig.topics.dlq) else None
    rig.now = T_MS + 10
    with pytest.raises(DeliveryError):
        asyncio.run(rig.fire([rig.tick_record(T)]))

    # Its callback was refused for good and its dead letter was lost: the changelog, as
    # delivered, must still hold it, so that the worker restarted dead-letters it then.
    rebuilt = PartitionTimers(tmp_path / "rebuilt.db")
    try:
        rebuilt.apply([(s.key or b"", s.value) for s in rig.changelog(0) if s.delivered], offset=None)
        assert [d.timer_id for d in rebuilt.iter_pending()] == ["gone-1", "ok"]
    finally:
        rebuilt.close()
    rig.producer.fail = lambda t: permanent_error() if t == "gone" else None
    rig.tick(T)
    assert [(s.key, s.header("kt-reason")) for s in rig.dlq() if s.delivered] == [
        (b"gone-1", b"callback-undeliverable")
    ]
    assert rig.pending_ids() == []


@pytest.mark.parametrize("extra", UNKNOWN_FIELDS.values(), ids=UNKNOWN_FIELDS.keys())
def test_a_future_with_unknown_fields_of_any_wire_type_fires_with_its_callback_intact(rig: Rig, extra: bytes):
    rig.ingest(
        rig.request("before", T_MS - 300),
        rig.raw_request(b"odd", unknown_fields_future("odd", T_MS - 200, extra)),
        rig.request("after", T_MS - 100),
    )
    rig.tick(T)

    assert rig.fired() == ["before", "odd", "after"]
    odd = rig.callbacks()[1]
    assert (odd.key, odd.value) == (b"key-odd", b"payload-odd")
    assert (odd.header("h"), odd.header("kt-token")) == (b"v", b"tok")
    assert rig.dlq() == []
    assert rig.pending_ids() == []


# Bytes protobuf does not read: a length past the end; an end-group that closes no group.
UNREADABLE = {"length past the end": b"\x0a\x05ab", "stray end-group": b"\x0a\x00\x7c"}


@pytest.mark.parametrize("ahead", [False, True], ids=["built at the tick", "built ahead"])
@pytest.mark.parametrize("stored", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_stored_timer_no_callback_can_be_built_from_is_dead_lettered_alone_and_its_second_fires(
    rig: Rig, tmp_path: Path, stored: bytes, ahead: bool
):
    # A table holding bytes protobuf does not read (damaged, or written by hand): the timer can
    # never fire, and must not stop every firing of its partition, on every owner, for good.
    rig.ingest(*(rig.request(name, T_MS - 400 + 100 * i) for i, name in enumerate(["a", "bad", "c", "d"])))
    bad_key = table_key(T_MS - 300, "bad")
    rig.table(0).apply([(bad_key, stored)], offset=None)
    if ahead:  # its callback built while the worker waits for its tick
        rig.now = (T - 1) * 1000 + 10

        async def tick_and_build() -> None:
            await rig.fire([rig.tick_record(T - 1)])
            await rig.between_ticks()

        asyncio.run(tick_and_build())
    rig.tick(T)

    assert rig.fired() == ["a", "c", "d"]
    (letter,) = rig.dlq()
    assert (letter.key, letter.value) == (b"bad", stored)  # as the table held it
    assert letter.header("kt-reason") == b"unreadable-timer"
    assert letter.header("kt-source-partition") == b"0"
    assert [(e.id, e.due_ms) for e in rig.events(Kind.REJECTED)] == [("bad", T_MS - 300)]
    assert rig.pending_ids() == []
    # Deleted through the changelog, after its dead letter was delivered: a new owner of the
    # partition, which rebuilds the table from the changelog, does not meet it again.
    (deleted,) = [sent for key, sent in rig.deletions() if key == bad_key]
    assert deleted.delivered
    rebuilt = PartitionTimers(tmp_path / "rebuilt.db")
    try:
        rebuilt.apply([(s.key or b"", s.value) for s in rig.changelog(0)], offset=None)
        assert list(rebuilt.iter_pending()) == []
    finally:
        rebuilt.close()
    rig.ingest(rig.request("later", T_MS + 500))
    rig.tick(T + 1)
    assert rig.fired() == ["a", "c", "d", "later"]
    assert len(rig.dlq()) == 1


def test_a_future_nesting_groups_as_deep_as_protobuf_reads_is_dead_lettered_when_due(rig: Rig):
    # Protobuf reads a Future whose groups nest 100 levels deep, but not the StoredTimer that
    # holds it a level down: it is accepted, and dead-lettered when it comes due.
    deep = Future(callBackTopic="orders", id="deep", due_ms=T_MS - 200).SerializeToString() + nested_groups(
        100
    )
    rig.ingest(rig.request("a", T_MS - 300), rig.raw_request(b"deep", deep), rig.request("b", T_MS - 100))
    rig.tick(T)

    assert rig.fired() == ["a", "b"]
    (letter,) = rig.dlq()
    assert (letter.key, letter.header("kt-reason")) == (b"deep", b"unreadable-timer")
    assert rig.pending_ids() == []


#: Seconds an oscillator topic may carry, around the worker's clock and far from it.
_tick_seconds = st.one_of(
    st.integers(min_value=T - 5, max_value=T + 10),
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=-(2**63), max_value=-1),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2_000), st.lists(_tick_seconds, max_size=4)),
        min_size=1,
        max_size=12,
    )
)
def test_whatever_arrives_on_oscillator_nothing_fires_before_the_workers_clock_reaches_its_due_time(steps):
    with tempfile.TemporaryDirectory() as directory:
        rig = new_rig(Path(directory))
        try:
            rig.now = T_MS - 3_000
            due = {f"t{i}": T_MS - 2_000 + 97 * i for i in range(150)}  # over 14.5 s from T - 2
            rig.ingest(*(rig.request(timer_id, due_ms) for timer_id, due_ms in due.items()))
            for moved_ms, seconds in steps:
                rig.now += moved_ms
                ticks = [
                    SourceRecord(rig.topics.oscillator, 0, 0, str(second).encode(), None)
                    for second in seconds
                ]
                rig.advance(ticks)  # note_ticks, then fire_ready: as the consumer and the engine do
                assert all(int(cb.header("kt-due-ms") or 0) <= (cb.at_ms or 0) for cb in rig.callbacks()), (
                    "a callback went out before its due time by the worker's clock"
                )
                # Nothing further ahead waits, so nothing holds the real ticks back.
                limit_ms = rig.now + rig.config.clock_tolerance_ms
                assert all(second * 1000 <= limit_ms for second in rig.engine._waiting.seconds().values())
        finally:
            rig.close()
