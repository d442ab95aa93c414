"""Hostile records, one class at a time: each is dead-lettered with its reason, none raises.

The fuzz suite (``test_fuzz.py``) shows no record makes a parser raise; these
pin the reason and the detail a user gets for each known kind of bad input.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from futures.ingress.base import MAX_DUE_MS, MAX_ID_BYTES, TABLE_KEY_OVERHEAD
from futures.ingress.formats import PARSERS
from futures.ingress.requests import Rejection, Schedule, parse_record
from futures.worker.table import table_key
from ktimers.config import IngressFormat
from ktimers.deadletter import MAX_DETAIL_CHARS
from ktimers.wire import Cancel, Future, FutureBatch
from tests.ingress.helpers import (
    CONFIG,
    COUNTDOWN_TOPIC,
    ETF1_TOPIC,
    NOW_MS,
    SENT_MS,
    headers_of,
    parse,
    record,
    rejected,
    scheduled,
)

REQUEST = CONFIG.topics.request
# Without the due-ahead limit, far due times reach the range check.
NO_AHEAD = replace(CONFIG, max_due_ahead_s=0)
NOT_UTF8_NAME = b"\xff\xfe".decode("utf-8", "surrogateescape")  # as the consumer decodes such a name
HUGE = 1_000_000


def short(rejection: Rejection) -> Rejection:
    """The rejection, after checking what every one must be: a short detail and a usable key."""
    assert 0 < len(rejection.detail) <= MAX_DETAIL_CHARS, len(rejection.detail)
    rejection.detail.encode()  # it goes into the kt-error header
    assert 0 < len(rejection.timer_id.encode()) <= MAX_ID_BYTES
    return rejection


# -- one entry point, never an exception ---------------------------------------


@pytest.mark.parametrize(
    ("fmt", "rec"),
    [
        (IngressFormat.NATIVE, record(REQUEST, b"x")),
        (IngressFormat.ETF1, record(ETF1_TOPIC, b"x", b"k")),
        (IngressFormat.COUNTDOWN, record(COUNTDOWN_TOPIC, b"{}")),
    ],
)
def test_a_parser_that_raises_dead_letters_the_record_as_internal_error(monkeypatch, fmt, rec):
    def broken(record, context):
        raise KeyError("\ud800" + "x" * HUGE)  # the text quotes input: long, and not even UTF-8

    monkeypatch.setitem(PARSERS, fmt, broken)
    rejection = short(rejected(rec))
    assert (rejection.reason, rejection.record) == ("internal-error", rec)
    assert rejection.detail.startswith("KeyError: ")
    assert len(rejection.detail) <= 200
    assert rejection.timer_id == f"seed-{'' if fmt is IngressFormat.NATIVE else rec.topic + '-'}2-17"


def test_a_parser_that_recurses_too_deep_is_an_internal_error_too(monkeypatch):
    def deep(record, context):
        return deep(record, context)

    monkeypatch.setitem(PARSERS, IngressFormat.NATIVE, deep)
    rejection = short(rejected(record(REQUEST, b"x")))
    assert rejection.reason == "internal-error"
    assert rejection.detail.startswith("RecursionError: ")


def test_the_table_key_overhead_is_that_of_the_table():
    assert TABLE_KEY_OVERHEAD == len(table_key(0, ""))


# -- native ----------------------------------------------------------------------


def native(key: bytes | None = None, kind: bytes | None = None, **fields: object):
    fields.setdefault("callBackTopic", "cb-x")
    value = Future(**fields).SerializeToString()  # type: ignore[arg-type]
    return record(REQUEST, value, key, headers=(("kt-kind", kind),) if kind else ())


def test_due_times_up_to_the_end_of_year_9999_are_accepted():
    assert scheduled(native(due_ms=MAX_DUE_MS), NO_AHEAD).due_ms == MAX_DUE_MS
    assert scheduled(native(key=b"253402300799"), NO_AHEAD).due_ms == 253_402_300_799_000


@pytest.mark.parametrize(
    "rec",
    [
        pytest.param(native(due_ms=MAX_DUE_MS + 1), id="due-ms-after-9999"),
        pytest.param(native(due_ms=2**63 - 1), id="due-ms-int64-max"),
        pytest.param(native(due_ms=-(2**63)), id="due-ms-int64-min"),
        pytest.param(native(due_ms=-1), id="due-ms-negative"),
        # The seed key may have 12 digits: the year 31688, not an overflow.
        pytest.param(native(key=b"999999999999"), id="key-second-after-9999"),
        pytest.param(native(key=b"253402300800"), id="key-second-just-after-9999"),
        pytest.param(native(key=b"9" * HUGE), id="key-huge-number"),
        pytest.param(native(key=b"\xff" * HUGE), id="key-huge-garbage"),
    ],
)
def test_due_times_outside_year_0_to_9999_are_bad_due_times(rec):
    rejection = short(rejected(rec, NO_AHEAD))
    assert rejection.reason == "bad-due-time"


def test_a_due_time_after_9999_says_the_allowed_range():
    detail = rejected(native(due_ms=MAX_DUE_MS + 1), NO_AHEAD).detail
    assert "9999-12-31T23:59:59.999Z" in detail and str(MAX_DUE_MS) in detail


def test_an_id_that_is_not_utf8_does_not_decode():
    # Future.id is a proto3 string: protobuf itself refuses invalid UTF-8.
    value = Future(callBackTopic="cb-x", due_ms=1).SerializeToString() + b"\x22\x01\xff"  # field 4, b"\xff"
    assert short(rejected(record(REQUEST, value))).reason == "undecodable"


def test_a_cancel_of_an_id_too_long_to_be_a_key_is_an_invalid_id():
    rec = record(REQUEST, Cancel(id="x" * HUGE).SerializeToString(), headers=(("kt-kind", b"cancel"),))
    rejection = short(rejected(rec))
    assert (rejection.reason, rejection.timer_id) == ("invalid-id", "seed-2-17")
    at_limit = record(REQUEST, Cancel(id="é" * 256).SerializeToString(), headers=(("kt-kind", b"cancel"),))
    assert parse(at_limit)[0].timer_id == "é" * 256


@pytest.mark.parametrize(
    ("rec", "reason", "timer_id"),
    [
        # The derived id stands in for one too long to key a REJECTED event.
        pytest.param(native(id="x" * HUGE, due_ms=1), "invalid-id", "seed-2-17", id="id-huge"),
        pytest.param(native(id="x" * HUGE, key=b"soon"), "bad-due-time", "seed-2-17", id="id-huge-no-due"),
        pytest.param(
            native(callBackTopic="a" * HUGE, due_ms=1), "invalid-callback-topic", "seed-2-17", id="topic-huge"
        ),
        pytest.param(native(kind=b"k" * HUGE, due_ms=1), "unknown-kind", "seed-2-17", id="kind-huge"),
        pytest.param(native(key=b"k" * HUGE, id="t-1"), "bad-due-time", "t-1", id="key-huge"),
        pytest.param(record(REQUEST, b"\x0a\xff" * HUGE), "undecodable", "seed-2-17", id="garbage-huge"),
    ],
)
def test_huge_fields_give_short_details_and_an_id_that_fits_a_key(rec, reason, timer_id):
    rejection = short(rejected(rec))
    assert (rejection.reason, rejection.timer_id) == (reason, timer_id)


def test_each_timer_of_a_batch_passes_the_same_range_checks():
    futures = [
        Future(callBackTopic="cb-x", id="ok", due_ms=NOW_MS),
        Future(callBackTopic="cb-x", id="late", due_ms=MAX_DUE_MS + 1),
        Future(callBackTopic="cb-x", id="neg", due_ms=-(2**63)),
        Future(callBackTopic="cb-x", id="x" * HUGE, due_ms=NOW_MS),
        Future(callBackTopic="cb-x", id="y" * HUGE),
    ]
    rec = record(REQUEST, FutureBatch(futures=futures).SerializeToString(), headers=(("kt-kind", b"batch"),))
    ok, late, neg, long_id, long_no_due = parse_record(rec, NO_AHEAD, NOW_MS)
    assert isinstance(ok, Schedule)
    assert [(r.reason, r.timer_id) for r in map(short, (late, neg, long_id, long_no_due))] == [
        ("bad-due-time", "late"),
        ("bad-due-time", "neg"),
        ("invalid-id", "seed-2-17-3"),
        ("bad-due-time", "seed-2-17-4"),
    ]


def test_odd_header_names_and_null_values_do_not_disturb_a_native_record():
    rec = native(due_ms=NOW_MS)
    rec = replace(rec, headers=((NOT_UTF8_NAME, b"x"), ("kt-kind", None), ("other", None)))
    assert scheduled(rec).due_ms == NOW_MS  # a null kt-kind is no kind: a Future


# -- etf1 ------------------------------------------------------------------------


def etf1(key: bytes | None = b"vid1", value: bytes | None = b"v", epoch: bytes = b"1795000000", *extra):
    headers = (
        ("scheduler-epoch", epoch),
        ("scheduler-target-topic", b"cb-x"),
        ("scheduler-target-key", b"k"),
        *extra,
    )
    return record(ETF1_TOPIC, value, key, headers=headers)


def test_a_header_name_that_is_not_utf8_is_an_invalid_header():
    rec = etf1(b"vid1", b"v", b"1795000000", (NOT_UTF8_NAME, b"x"))
    rejection = short(rejected(rec))
    assert (rejection.reason, rejection.record) == ("invalid-header", rec)  # dead-lettered as it came
    assert "\\udcff\\udcfe" in rejection.detail  # named, escaped


def test_header_values_may_be_null():
    result = scheduled(etf1(b"vid1", b"v", b"1795000000", ("customer-header", None)))
    assert ("customer-header", b"") in headers_of(result)


@pytest.mark.parametrize(
    ("rec", "reason"),
    [
        pytest.param(etf1(epoch=b"999999999999"), "bad-due-time", id="epoch-12-digits-after-9999"),
        pytest.param(etf1(epoch=b"253402300800"), "bad-due-time", id="epoch-just-after-9999"),
        pytest.param(etf1(epoch=b"9" * HUGE), "bad-due-time", id="epoch-huge"),
        pytest.param(etf1(epoch=b"\xff" * HUGE), "bad-due-time", id="epoch-garbage"),
        pytest.param(etf1(key=b"\xff" * HUGE), "invalid-id", id="key-not-utf8-huge"),
        pytest.param(etf1(key=b"k" * HUGE), "invalid-id", id="key-too-long"),
        pytest.param(etf1(key=b"k" * HUGE, value=None), "invalid-id", id="delete-key-too-long"),
    ],
)
def test_hostile_schedules_are_rejected_with_short_details(rec, reason):
    rejection = short(rejected(rec, NO_AHEAD))
    assert rejection.reason == reason


def test_a_schedule_at_the_end_of_year_9999_is_accepted():
    assert scheduled(etf1(epoch=b"253402300799"), NO_AHEAD).due_ms == 253_402_300_799_000


# -- countdown -------------------------------------------------------------------


def countdown(value: bytes, key: bytes | None = b"order-9", **kw):
    return record(COUNTDOWN_TOPIC, value, key, headers=(("CALLER_SERVICE", b"billing"),), **kw)


def body(field: str = "countdown", number: str = "1", topic: str = '"T"', message: str = '"m"') -> bytes:
    return f'{{"topic": {topic}, "message": {message}, "{field}": {number}}}'.encode()


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (body(number="1e400"), "bad-due-time", "9999"),  # a float: inf
        (body(number="1e308"), "bad-due-time", "9999"),  # times 1000 is inf
        (body(number="9" * 4000), "bad-due-time", "…"),  # float() of it overflows; cut in the detail
        (body(number="-" + "9" * 4000), "bad-due-time", "negative"),
        (body(number="Infinity"), "bad-due-time", "9999"),
        (body(number="-Infinity"), "bad-due-time", "negative"),
        (body(number="NaN"), "bad-due-time", "finite number"),
        (body("at", "253402300800"), "bad-due-time", "9999"),
        (body("at", "1e300"), "bad-due-time", "9999"),
        (body(number="9" * 5000), "undecodable", "4300 digits"),  # Python's json refuses it
        (b"[" * 100_000, "undecodable", "nested"),
        (b'{"a": ' * 100_000, "undecodable", "nested"),
        (body(topic='"\\ud800"'), "invalid-field", '"topic"'),
        (body(message='"x\\udfff"'), "invalid-field", '"message"'),
        (b'{"topic": "T", "message": "m", "countdown": 1, "key": "\\ud800"}', "invalid-field", '"key"'),
        (b'{"topic": "T", "message": "m", "countdown": "' + b"x" * HUGE + b'"}', "bad-due-time", "number"),
        (b'{"topic": "' + b"a" * HUGE + b'", "message": "m", "countdown": 1}', "invalid-callback-topic", "…"),
        (b"{" + b" " * HUGE, "undecodable", "not JSON"),
    ],
)
def test_hostile_json_is_rejected_with_its_reason(value, reason, detail):
    rec = countdown(value)
    rejection = short(rejected(rec, NO_AHEAD))
    assert (rejection.reason, rejection.record) == (reason, rec)
    assert detail in rejection.detail
    assert rejection.timer_id == f"seed-{COUNTDOWN_TOPIC}-2-17"


def test_raw_utf8_surrogates_in_a_json_string_are_an_invalid_field():
    rec = countdown(b'{"topic": "T", "message": "\xed\xa0\x80", "countdown": 1}')
    assert short(rejected(rec)).reason == "invalid-field"


def test_odd_but_valid_numbers_schedule():
    assert scheduled(countdown(body(number="-0.0"))).due_ms == SENT_MS
    assert scheduled(countdown(body("at", "253402300799.999")), NO_AHEAD).due_ms == MAX_DUE_MS


def test_a_countdown_from_a_timestamp_near_the_end_of_time_is_a_bad_due_time():
    rec = countdown(body(number="2"), timestamp_ms=MAX_DUE_MS - 1000)
    assert short(rejected(rec, NO_AHEAD)).reason == "bad-due-time"


def test_a_caller_header_among_undecodable_names_is_still_carried():
    rec = record(
        COUNTDOWN_TOPIC,
        body(),
        b"k",
        headers=((NOT_UTF8_NAME, b"x"), ("CALLER_SERVICE", b"billing"), ("x", None)),
    )
    assert headers_of(scheduled(rec)) == [("CALLER_SERVICE", b"billing")]
