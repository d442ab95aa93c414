"""The etf1 kafka-message-scheduler format: what a schedule record becomes."""

from __future__ import annotations

import pytest

from tests.ingress.helpers import (
    ETF1_TOPIC,
    SENT_MS,
    cancelled,
    headers_of,
    record,
    rejected,
    scheduled,
)

EPOCH = 1_795_000_000


def schedule(key: bytes | None = b"vid1-online", value: bytes | None = b"video 1", **headers: bytes | None):
    base = {
        "scheduler-epoch": str(EPOCH).encode(),
        "scheduler-target-topic": b"online-videos",
        "scheduler-target-key": b"vid1",
    }
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    pairs = tuple((k, v) for k, v in base.items() if v is not None)
    return record(ETF1_TOPIC, value, key, headers=(*pairs, ("customer-header", b"dummy")))


def test_schedule_delivers_payload_to_target_with_the_schedulers_headers():
    result = scheduled(schedule())
    future = result.timer.future
    assert result.due_ms == EPOCH * 1000
    assert (future.callBackTopic, future.callBackKey, future.callBack) == (
        "online-videos",
        "vid1",
        b"video 1",
    )
    # As the original scheduler: every header of the schedule, then where it came from.
    assert headers_of(result) == [
        ("scheduler-epoch", str(EPOCH).encode()),
        ("scheduler-target-topic", b"online-videos"),
        ("scheduler-target-key", b"vid1"),
        ("customer-header", b"dummy"),
        ("scheduler-timestamp", str(SENT_MS // 1000).encode()),
        ("scheduler-key", b"vid1-online"),
        ("scheduler-topic", ETF1_TOPIC.encode()),
    ]
    assert result.timer.source_topic == ETF1_TOPIC


def test_the_key_is_the_schedule_id_so_a_newer_record_replaces_and_a_tombstone_deletes():
    first = scheduled(schedule(value=b"v1"))
    newer = scheduled(schedule(value=b"v2", scheduler_epoch=str(EPOCH + 60).encode()))
    assert first.timer_id == newer.timer_id == f"{ETF1_TOPIC}:vid1-online"
    assert newer.due_ms == (EPOCH + 60) * 1000
    assert cancelled(schedule(value=None)).timer_id == first.timer_id


def test_empty_value_is_a_payload_not_a_delete():
    assert scheduled(schedule(value=b"")).timer.future.callBack == b""


def test_our_reserved_headers_are_not_carried_over():
    rec = record(
        ETF1_TOPIC,
        b"v",
        b"k",
        headers=(
            ("scheduler-epoch", str(EPOCH).encode()),
            ("scheduler-target-topic", b"online-videos"),
            ("scheduler-target-key", b"x"),
            ("kt-token", b"forged"),
        ),
    )
    assert "kt-token" not in dict(headers_of(scheduled(rec)))


@pytest.mark.parametrize(
    ("rec", "reason", "detail"),
    [
        (schedule(key=None), "missing-id", "key"),
        (schedule(key=b""), "missing-id", "key"),
        (schedule(key=b"\xff\xfe"), "invalid-id", "UTF-8"),
        (schedule(scheduler_epoch=None), "missing-header", "scheduler-epoch"),
        (schedule(scheduler_epoch=b"tomorrow"), "bad-due-time", "scheduler-epoch"),
        (schedule(scheduler_epoch=b"-5"), "bad-due-time", "scheduler-epoch"),
        (schedule(scheduler_epoch=b"1795000000.5"), "bad-due-time", "scheduler-epoch"),
        (schedule(scheduler_target_topic=None), "missing-header", "scheduler-target-topic"),
        (schedule(scheduler_target_key=None), "missing-header", "scheduler-target-key"),
        (schedule(scheduler_target_key=b"\xff"), "invalid-header", "UTF-8"),
        (schedule(scheduler_target_topic=b"bad topic!"), "invalid-callback-topic", "bad topic!"),
        (schedule(scheduler_target_topic=b"elsewhere"), "callback-topic-not-allowed", "elsewhere"),
        (schedule(scheduler_target_topic=ETF1_TOPIC.encode()), "callback-topic-not-allowed", "internal"),
        (schedule(value=b"x" * 1000), "payload-too-large", "callBack 1000 bytes"),
        (schedule(scheduler_epoch=str(EPOCH + 500 * 86400).encode()), "due-too-far", "ahead"),
    ],
)
def test_malformed_schedules_are_rejected_with_a_stable_reason(rec, reason, detail):
    rejection = rejected(rec)
    assert rejection.reason == reason
    assert detail in rejection.detail
    assert rejection.record is rec  # dead-lettered as it was sent
    assert rejection.timer_id  # every rejection has an id for its REJECTED event
