"""Fuzzing every ingress parser: any record gives schedules, cancels or rejections, never an exception.

A record that made a parser raise would be read again after the restart, and
raise again: one hostile record would stop its partition for good. So the
property, for native ``Future``/``Cancel``/``FutureBatch``, etf1 and countdown
records of any bytes, headers and numbers: :func:`parse_record` returns, and
what it returns keeps the promises the worker builds on (ids that fit a key,
due times in range, stored timers that fit the changelog, short details).
"""

from __future__ import annotations

import json

from hypothesis import event, given
from hypothesis import strategies as st

from futures.ingress.base import MAX_DUE_MS, MAX_ID_BYTES, PARSE_REASONS
from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, Rejection, Request, Schedule, parse_record
from futures.worker.table import table_key
from ktimers.config import IngressFormat, TopicsConfig
from ktimers.wire import Cancel, Future, FutureBatch, Header
from tests.ingress.fuzzing import FUZZ, mutated
from tests.ingress.helpers import COUNTDOWN_TOPIC, ETF1_TOPIC, NOW_MS

REQUEST = "timer-request"
# No allow-list and no due-ahead limit, so that timers get as far as the range
# and size checks; a limit small enough for generated timers to cross it.
CONFIG = ParseLimits(
    topics=TopicsConfig(
        ingress=((ETF1_TOPIC, IngressFormat.ETF1), (COUNTDOWN_TOPIC, IngressFormat.COUNTDOWN))
    ),
    max_payload_bytes=600,
)
# The parsers never raise, so the safety net must never be what answers.
EXPECTED_REASONS = PARSE_REASONS - {"internal-error", "unknown-topic"}
MAX_DETAIL = 1000


def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """``usual`` three draws in four: hostile input must not crowd out the requests that get far."""
    return st.one_of(usual, usual, usual, odd)


INT64 = st.integers(-(2**63), 2**63 - 1)
EXTREME_INTS = st.sampled_from(
    [0, -1, 1, MAX_DUE_MS, MAX_DUE_MS + 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 999_999_999_999_999]
)

# Header names as the consumer hands them over: text, ours, and names that were
# not UTF-8 on the wire (decoded with surrogateescape into lone surrogates).
RAW_NAMES = st.binary(min_size=1, max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))
NAMES = st.one_of(
    st.sampled_from(
        [
            "kt-kind",
            "kt-token",
            "scheduler-epoch",
            "scheduler-target-topic",
            "scheduler-target-key",
            "CALLER_SERVICE",
            "customer-header",
            b"\xff\xfe".decode("utf-8", "surrogateescape"),
        ]
    ),
    st.text(max_size=12),
    RAW_NAMES,
)
HEADER_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.sampled_from([b"future", b"cancel", b"batch", b"", b"\xff", b"cb-x", b"T", b"-5", b"999999999999"]),
    st.integers(0, 10**13).map(lambda n: str(n).encode()),
)
HEADERS = st.lists(st.tuples(NAMES, HEADER_VALUES), max_size=6).map(tuple)
KEYS = st.one_of(
    st.none(),
    st.binary(max_size=32),
    st.integers(-(10**13), 10**14).map(lambda n: str(n).encode()),
    st.sampled_from([b"1795000000", b"999999999999", b"253402300800", b"\xff\xfe", b"k" * 5000]),
)
TIMESTAMPS = st.one_of(st.just(-1), st.integers(0, 2**63 - 1), st.sampled_from([0, 1_794_998_999_000]))


def records(topic: str, values: st.SearchStrategy[bytes | None], headers=HEADERS, keys=KEYS):
    return st.builds(
        SourceRecord,
        topic=st.just(topic),
        partition=st.integers(0, 2**31 - 1),
        offset=st.integers(0, 2**63 - 1),
        key=keys,
        value=values,
        headers=headers,
        timestamp_ms=TIMESTAMPS,
    )


# -- native -------------------------------------------------------------------

TOPICS = mostly(
    st.sampled_from(["cb-x", "T", "orders.eu"]),
    st.one_of(
        st.sampled_from(["", "bad topic", "..", "a" * 300, REQUEST, "__consumer_offsets"]),
        st.text(max_size=20),
    ),
)
IDS = mostly(st.text(max_size=20), st.sampled_from(["x" * (MAX_ID_BYTES + 1), "é" * 300, "é" * 256]))
DUE_MS = mostly(st.integers(0, MAX_DUE_MS), st.one_of(st.none(), INT64, EXTREME_INTS))
FUTURES = st.builds(
    Future,
    callBackTopic=TOPICS,
    callBackKey=st.text(max_size=20),
    callBack=mostly(st.binary(max_size=64), st.just(b"x" * 700)),
    id=IDS,
    due_ms=DUE_MS,
    token=st.text(max_size=10),
    headers=st.lists(st.builds(Header, key=st.text(max_size=10), value=st.binary(max_size=10)), max_size=3),
)
BATCHES = st.lists(FUTURES, max_size=6).map(lambda fs: FutureBatch(futures=fs).SerializeToString())
CANCELS = st.builds(Cancel, id=IDS).map(Cancel.SerializeToString)
NATIVE_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=64),
    FUTURES.map(Future.SerializeToString),
    BATCHES,
    CANCELS,
    mutated(st.one_of(FUTURES.map(Future.SerializeToString), BATCHES, CANCELS)),
)
KINDS = mostly(
    st.sampled_from([(), (("kt-kind", b"future"),), (("kt-kind", b"cancel"),), (("kt-kind", b"batch"),)]),
    st.one_of(st.just(None), st.binary(max_size=8)).map(lambda k: (("kt-kind", k),)),
)
# Other headers first: the last kt-kind counts, and most records should keep theirs.
NATIVE_HEADERS = st.tuples(HEADERS, KINDS).map(lambda parts: parts[0] + parts[1])

# -- etf1 ---------------------------------------------------------------------

EPOCHS = mostly(
    st.integers(0, MAX_DUE_MS // 1000).map(lambda n: str(n).encode()),
    st.one_of(
        st.integers(0, 10**12 - 1).map(lambda n: str(n).encode()),
        st.sampled_from([b"999999999999", b"253402300799", b"253402300800", b"-5", b"1.5", b"", b"0" * 13]),
        st.binary(max_size=14),
    ),
)
TARGETS = mostly(
    st.sampled_from([b"cb-x", b"T"]),
    st.one_of(
        st.sampled_from([b"", b"bad topic!", b"\xff", ETF1_TOPIC.encode(), b"a" * 300]),
        st.binary(max_size=16),
    ),
)


@st.composite
def etf1_headers(draw: st.DrawFn) -> tuple[tuple[str, bytes | None], ...]:
    """The scheduler's three headers (each maybe missing or odd), among others."""
    named = [
        ("scheduler-epoch", draw(st.one_of(st.none(), EPOCHS))),
        ("scheduler-target-topic", draw(st.one_of(st.none(), TARGETS))),
        ("scheduler-target-key", draw(st.one_of(st.none(), TARGETS))),
    ]
    present = [h for h in named if draw(st.integers(0, 9)) > 0]  # mostly there, None values included
    return tuple(draw(st.permutations([*present, *draw(HEADERS)])))


ETF1_KEYS = mostly(st.text(min_size=1, max_size=20).map(str.encode), st.one_of(KEYS, st.just(b"k" * 600)))
ETF1_VALUES = mostly(st.binary(max_size=32), st.one_of(st.none(), st.just(b"v" * 700)))

# -- countdown ----------------------------------------------------------------

SURROGATE_TEXT = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=8).map(
    "".join
)
# JSON value texts, written out: Python's json reads NaN, Infinity and numbers
# that do not fit a float or (past 4,300 digits) an int at all.
NUMBER_TEXTS = st.one_of(
    st.integers().map(str),
    st.floats().map(json.dumps),  # NaN, Infinity, -Infinity, -0.0 included
    st.sampled_from(
        [
            "1e308",
            "1e400",
            "-1e400",
            "-0.0",
            "NaN",
            "Infinity",
            "-Infinity",
            "253402300799.999",
            "253402300800",
            "9" * 400,
            "-" + "9" * 400,
            "9" * 5000,
        ]
    ),
)
VALUE_TEXTS = st.one_of(
    NUMBER_TEXTS,
    SURROGATE_TEXT.map(json.dumps),
    st.sampled_from(["true", "null", "[]", "{}", '"120"', '"T"', '"cb-x"']),
)
FIELD_NAMES = st.sampled_from(["topic", "message", "countdown", "at", "key", "other"])


@st.composite
def countdown_bodies(draw: st.DrawFn) -> bytes:
    """A JSON object text, fields chosen from the format's and their values from anything JSON reads."""
    fields = {"topic": '"cb-x"', "message": '"m"'}
    for name in draw(st.sampled_from([["countdown"], ["at"], [], ["countdown", "at"]])):
        fields[name] = draw(mostly(NUMBER_TEXTS, VALUE_TEXTS))
    for name in draw(st.lists(FIELD_NAMES, max_size=3)):
        fields[name] = draw(VALUE_TEXTS)
    for name in draw(st.lists(FIELD_NAMES, max_size=1)):
        fields.pop(name, None)
    text = "{" + ", ".join(f'"{name}": {value}' for name, value in fields.items()) + "}"
    return text.encode(draw(st.sampled_from(["utf-8", "utf-16", "utf-32"])))


COUNTDOWN_BYTES = st.one_of(
    st.none(),
    st.binary(max_size=64),
    mutated(countdown_bodies()),
    st.sampled_from(
        [
            b"[" * 100_000,
            b'{"a": ' * 100_000,
            b"9" * 5000,
            b'"\\ud800"',
            b"\xed\xa0\x80",  # a surrogate, UTF-8-encoded: json decodes it with surrogatepass
            b'{"topic": "\xed\xa0\x80", "message": "m", "countdown": 1}',
        ]
    ),
)


# -- the property -------------------------------------------------------------


def check(record: SourceRecord, requests: list[Request]) -> None:
    assert isinstance(requests, list) and requests
    for request in requests:
        event(type(request).__name__ + (f" {request.reason}" if isinstance(request, Rejection) else ""))
        if isinstance(request, Rejection):
            assert request.reason in EXPECTED_REASONS, request
            assert request.detail and len(request.detail) <= MAX_DETAIL, request.detail[:2000]
            request.detail.encode()  # it goes into the kt-error header
            assert request.timer_id and len(request.timer_id.encode()) <= MAX_ID_BYTES
        elif isinstance(request, Schedule):
            assert 0 <= request.due_ms <= MAX_DUE_MS
            stored = request.timer
            assert stored.future.due_ms == request.due_ms
            assert stored.future.id and len(stored.future.id.encode()) <= MAX_ID_BYTES
            assert CONFIG.callback_topic_problem(stored.future.callBackTopic) is None
            key = table_key(request.due_ms, request.timer_id)
            assert len(stored.SerializeToString()) + len(key) <= CONFIG.max_payload_bytes
            assert (stored.source_topic, stored.source_offset) == (record.topic, record.offset)
        else:
            assert isinstance(request, CancelRequest), request
            assert request.timer_id and len(request.timer_id.encode()) <= MAX_ID_BYTES


@FUZZ
@given(records(REQUEST, NATIVE_VALUES, headers=NATIVE_HEADERS))
def test_native_records_of_any_bytes_never_raise(record):
    check(record, parse_record(record, CONFIG, NOW_MS))


@FUZZ
@given(records(REQUEST, FUTURES.map(Future.SerializeToString), headers=NATIVE_HEADERS))
def test_native_futures_with_extreme_fields_never_raise(record):
    check(record, parse_record(record, CONFIG, NOW_MS))


@FUZZ
@given(records(REQUEST, BATCHES, headers=st.just((("kt-kind", b"batch"),))))
def test_batches_of_extreme_futures_check_every_timer(record):
    requests = parse_record(record, CONFIG, NOW_MS)
    check(record, requests)
    futures = FutureBatch.FromString(record.value).futures
    if futures:  # one request per timer, in order: none lost, none doubled
        assert len(requests) == len(futures)


@FUZZ
@given(records(ETF1_TOPIC, ETF1_VALUES, etf1_headers(), ETF1_KEYS))
def test_etf1_records_never_raise(record):
    check(record, parse_record(record, CONFIG, NOW_MS))


@FUZZ
@given(records(COUNTDOWN_TOPIC, countdown_bodies(), keys=mostly(st.text(max_size=8).map(str.encode), KEYS)))
def test_countdown_json_of_any_field_values_never_raises(record):
    check(record, parse_record(record, CONFIG, NOW_MS))


@FUZZ
@given(st.sampled_from(["countdown", "at"]), NUMBER_TEXTS, TIMESTAMPS)
def test_countdown_due_of_any_number_never_raises(field, number, timestamp_ms):
    # Every draw reaches the due-time arithmetic: a number is the one thing that varies.
    value = f'{{"topic": "cb-x", "message": "m", "{field}": {number}}}'.encode()
    record = SourceRecord(COUNTDOWN_TOPIC, 0, 1, b"k", value, (), timestamp_ms)
    check(record, parse_record(record, CONFIG, NOW_MS))


@FUZZ
@given(records(COUNTDOWN_TOPIC, COUNTDOWN_BYTES))
def test_countdown_records_of_any_bytes_never_raise(record):
    check(record, parse_record(record, CONFIG, NOW_MS))
