"""The native format's batch record, and how records of every topic are dispatched."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from futures.ingress.requests import Rejection, Schedule
from ktimers.config import IngressFormat
from ktimers.wire import Cancel, Future, FutureBatch
from tests.ingress.helpers import CONFIG, COUNTDOWN_TOPIC, NOW_MS, parse, record, rejected, scheduled

REQUEST = CONFIG.topics.request
BATCH = (("kt-kind", b"batch"),)


def future(**fields: object) -> Future:
    fields.setdefault("callBackTopic", "cb-orders")
    fields.setdefault("due_ms", 1_795_000_000_250)
    return Future(**fields)  # type: ignore[arg-type]


def batch(*futures: Future) -> bytes:
    return FutureBatch(futures=futures).SerializeToString()


def test_a_batch_yields_its_timers_in_order_each_with_a_stable_id():
    rec = record(REQUEST, batch(future(id="a"), future(callBack=b"second"), future(id="c")), headers=BATCH)
    requests = parse(rec)
    assert [type(r) for r in requests] == [Schedule, Schedule, Schedule]
    # No id: derived from partition, offset and position, the same on every re-read.
    assert [r.timer_id for r in requests] == ["a", "seed-2-17-1", "c"]  # type: ignore[union-attr]
    assert [r.timer_id for r in parse(rec)] == ["a", "seed-2-17-1", "c"]  # type: ignore[union-attr]
    assert requests[1].timer.future.callBack == b"second"  # type: ignore[union-attr]
    assert {r.timer.source_offset for r in requests} == {17}  # type: ignore[union-attr]


def test_a_bad_timer_is_dead_lettered_alone_as_a_single_resendable_future():
    bad = future(id="bad", callBackTopic="not-allowed")
    rec = record(REQUEST, batch(future(id="ok"), bad, future(id="no-due", due_ms=None)), headers=BATCH)
    ok, rejection, no_due = parse(rec)
    assert isinstance(ok, Schedule)
    assert isinstance(rejection, Rejection) and isinstance(no_due, Rejection)
    assert (rejection.reason, rejection.timer_id) == ("callback-topic-not-allowed", "bad")
    assert (no_due.reason, no_due.timer_id) == ("bad-due-time", "no-due")
    # What goes to the DLQ is the one Future, keyed by its id, with where it sat in the batch.
    assert Future.FromString(rejection.record.value or b"") == bad
    assert rejection.record.key == b"bad"
    assert dict(rejection.record.headers) == {"kt-kind": b"future", "kt-source-index": b"1"}
    assert (rejection.record.topic, rejection.record.partition, rejection.record.offset) == (REQUEST, 2, 17)


@pytest.mark.parametrize(
    ("value", "reason"),
    [(b"\xff\xff\xff", "undecodable"), (None, "empty-batch"), (b"", "empty-batch")],
)
def test_a_broken_batch_record_is_rejected_whole(value, reason):
    assert rejected(record(REQUEST, value, headers=BATCH)).reason == reason


def test_single_future_and_cancel_still_parse_as_before():
    seed = Future(callBackTopic="cb-orders", callBack=b"x").SerializeToString()
    assert scheduled(record(REQUEST, seed, b"1795000000")).timer_id == "seed-2-17"
    cancel = record(REQUEST, Cancel(id="t-1").SerializeToString(), headers=(("kt-kind", b"cancel"),))
    assert parse(cancel)[0].timer_id == "t-1"  # type: ignore[union-attr]


def test_the_native_format_on_another_topic_namespaces_derived_ids():
    config_topics = CONFIG.topics
    other = "more-requests"
    topics = replace(config_topics, ingress=((other, IngressFormat.NATIVE),))
    config = replace(CONFIG, topics=topics)
    seed = Future(callBackTopic="cb-orders", callBack=b"x").SerializeToString()
    assert scheduled(record(other, seed, b"1795000000"), config).timer_id == "seed-more-requests-2-17"


def test_a_record_of_a_topic_that_carries_no_requests_is_rejected():
    rejection = rejected(record("somewhere-else", b"x"))
    assert rejection.reason == "unknown-topic"
    assert "TIMERS_INGRESS_TOPICS" in rejection.detail


def test_every_format_ends_in_the_same_stored_timer():
    # One internal representation: the same timer through etf1, countdown and native is stored alike.
    etf1 = record(
        "schedules",
        b"body",
        b"id-1",
        headers=(
            ("scheduler-epoch", b"1795000001"),
            ("scheduler-target-topic", b"cb-x"),
            ("scheduler-target-key", b"k"),
        ),
    )
    countdown = record(
        COUNTDOWN_TOPIC,
        json.dumps({"topic": "cb-x", "message": "body", "at": 1795000001, "key": "k"}).encode(),
    )
    native = record(
        REQUEST,
        future(
            callBackTopic="cb-x", callBackKey="k", callBack=b"body", due_ms=1795000001000
        ).SerializeToString(),
    )
    for rec in (etf1, countdown, native):
        stored = scheduled(rec).timer
        assert (stored.future.callBackTopic, stored.future.callBackKey, stored.future.callBack) == (
            "cb-x",
            "k",
            b"body",
        )
        assert stored.future.due_ms == 1_795_000_001_000
        assert stored.accepted_ms == NOW_MS
        assert stored.source_topic == rec.topic
