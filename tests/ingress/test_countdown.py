"""The JSON countdown format: what a request record becomes."""

from __future__ import annotations

import json

import pytest

from tests.ingress.helpers import (
    COUNTDOWN_TOPIC,
    NOW_MS,
    SENT_MS,
    headers_of,
    record,
    rejected,
    scheduled,
)


def request(body: object, key: bytes | None = b"order-9", caller: bytes | None = b"billing", **kw):
    value = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = (("CALLER_SERVICE", caller),) if caller is not None else ()
    return record(COUNTDOWN_TOPIC, value, key, headers=(*headers, ("other", b"dropped")), **kw)


def test_countdown_is_counted_from_the_records_timestamp():
    result = scheduled(request({"topic": "T", "message": "pay order 9", "countdown": 120}))
    future = result.timer.future
    assert result.due_ms == SENT_MS + 120_000
    assert (future.callBackTopic, future.callBackKey, future.callBack) == ("T", "order-9", b"pay order 9")
    assert headers_of(result) == [("CALLER_SERVICE", b"billing")]  # carried for tracking; nothing else
    assert result.timer_id == f"seed-{COUNTDOWN_TOPIC}-2-17"


def test_fractional_countdown_absolute_time_and_explicit_key():
    assert scheduled(request({"topic": "T", "message": "m", "countdown": 0.25})).due_ms == SENT_MS + 250
    result = scheduled(request({"topic": "T", "message": "m", "at": 1_795_000_000.5, "key": "k-1"}))
    assert result.due_ms == 1_795_000_000_500
    assert result.timer.future.callBackKey == "k-1"


def test_without_a_record_timestamp_the_worker_clock_counts():
    result = scheduled(request({"topic": "T", "message": "m", "countdown": 1}, timestamp_ms=-1))
    assert result.due_ms == NOW_MS + 1000


def test_no_caller_header_and_no_key_deliver_none_and_an_empty_key():
    result = scheduled(request({"topic": "T", "message": "m", "countdown": 1}, key=None, caller=None))
    assert headers_of(result) == []
    assert result.timer.future.callBackKey == ""


def test_reading_the_record_again_gives_the_same_timer():
    rec = request({"topic": "T", "message": "m", "countdown": 5})
    assert scheduled(rec).timer.future == scheduled(rec).timer.future


@pytest.mark.parametrize(
    ("body", "reason", "detail"),
    [
        (b"{not json", "undecodable", "not JSON"),
        (b"\xff\xfe", "undecodable", "not JSON"),
        ([1, 2], "undecodable", "JSON object"),
        ({"message": "m", "countdown": 1}, "missing-field", '"topic"'),
        ({"topic": "T", "countdown": 1}, "missing-field", '"message"'),
        ({"topic": "T", "message": "m"}, "missing-field", '"countdown"'),
        ({"topic": "T", "message": "m", "countdown": 1, "at": 5}, "bad-due-time", "exactly one"),
        ({"topic": "T", "message": "m", "countdown": -1}, "bad-due-time", "negative"),
        ({"topic": "T", "message": "m", "countdown": "120"}, "bad-due-time", "number"),
        ({"topic": "T", "message": "m", "countdown": True}, "bad-due-time", "number"),
        ({"topic": "T", "message": {"x": 1}, "countdown": 1}, "invalid-field", '"message"'),
        ({"topic": 7, "message": "m", "countdown": 1}, "invalid-field", '"topic"'),
        ({"topic": "T", "message": "m", "countdown": 1, "key": 5}, "invalid-field", '"key"'),
        ({"topic": "", "message": "m", "countdown": 1}, "missing-callback-topic", "empty"),
        ({"topic": "nope", "message": "m", "countdown": 1}, "callback-topic-not-allowed", "nope"),
        ({"topic": "T", "message": "x" * 1000, "countdown": 1}, "payload-too-large", "callBack 1000 bytes"),
    ],
)
def test_malformed_requests_are_rejected_with_a_stable_reason(body, reason, detail):
    rec = request(body)
    rejection = rejected(rec)
    assert (rejection.reason, rejection.record) == (reason, rec)
    assert detail in rejection.detail
    assert rejection.timer_id == f"seed-{COUNTDOWN_TOPIC}-2-17"


def test_tombstone_is_rejected():
    assert rejected(record(COUNTDOWN_TOPIC, None, b"k")).reason == "undecodable"
