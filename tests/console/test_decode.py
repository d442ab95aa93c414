"""`timers watch` reads the service's own records for people: events, dead letters, requests.

Whatever a topic holds (any bytes, any headers, numbers out of every range), a record gives
lines to print, never an exception: one bad record must not stop a watch.
"""

from __future__ import annotations

import json

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE
from hypothesis import given
from hypothesis import strategies as st

from futures.console import decode
from futures.console.watch import record_json, watch_lines
from ktimers.config import TopicsConfig
from ktimers.wire import (
    Cancel,
    FiredTimers,
    Future,
    FutureBatch,
    Header,
    Recurrence,
    TimerEvent,
    TimerEventBatch,
)
from tests.ingress.fuzzing import FUZZ, mutated

TOPICS = TopicsConfig()


class Msg:
    """A consumed record as confluent-kafka hands it over."""

    def __init__(self, topic, value, headers=None, key=None, timestamp_ms=None):
        self._topic, self._value, self._headers, self._key = topic, value, headers, key
        self._timestamp_ms = timestamp_ms

    def topic(self):
        return self._topic

    def partition(self):
        return 1

    def offset(self):
        return 7

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers

    def timestamp(self):
        if self._timestamp_ms is None:
            return TIMESTAMP_NOT_AVAILABLE, -1
        return TIMESTAMP_CREATE_TIME, self._timestamp_ms


def test_an_event_batch_is_one_line_per_event_in_the_order_they_happened():
    batch = TimerEventBatch(
        events=[
            TimerEvent(id="a", kind=TimerEvent.CANCELLED, due_ms=1_800_000_000_000, at_ms=5, partition=2)
        ],
        fired=[FiredTimers(id=["b", "c"], due_ms=[1, 2], source_offset=[10, 11], at_ms=9, partition=2)],
    )
    msg = Msg(TOPICS.events, batch.SerializeToString(), [("kt-kind", b"batch")], key=b"2")
    lines = watch_lines(msg, TOPICS)
    assert [(line["event"], line["id"]) for line in lines] == [
        ("CANCELLED", "a"),
        ("FIRED", "b"),
        ("FIRED", "c"),
    ]
    assert lines[0] == {
        "partition": 1,
        "offset": 7,
        "event": "CANCELLED",
        "id": "a",
        "due_ms": 1_800_000_000_000,
        "due": "2027-01-15T08:00:00.000Z",
        "at_ms": 5,
        "at": "1970-01-01T00:00:00.005Z",
        "request_partition": 2,
        "source_offset": 0,
    }
    assert lines[2]["source_offset"] == 11


def test_a_single_event_record_and_its_reason():
    event = TimerEvent(
        id="x", kind=TimerEvent.CANCEL_MISSED, at_ms=1, partition=0, source_offset=-1, reason="nope"
    )
    (line,) = watch_lines(Msg(TOPICS.events, event.SerializeToString(), []), TOPICS)
    assert (line["event"], line["reason"], line["due_ms"]) == ("CANCEL_MISSED", "nope", None)


def test_an_events_record_without_events_still_prints_a_line():
    (line,) = watch_lines(Msg(TOPICS.events, b"", [("kt-kind", b"batch")]), TOPICS)
    assert line["decode_error"] == "a timer-events record with no events"


def test_a_dead_letter_shows_why_where_from_and_the_request_it_held():
    future = Future(
        callBackTopic="orders", callBackKey="k", callBack=b"v", id="t-1", due_ms=1000, token="secret"
    )
    future.headers.append(Header(key="h", value=b"1"))
    headers = [
        ("h2", b"x"),
        ("kt-reason", b"callback-topic-not-allowed"),
        ("kt-error", b"'orders' is not allowed"),
        ("kt-source-topic", b"timer-request"),
        ("kt-source-partition", b"3"),
        ("kt-source-offset", b"42"),
    ]
    (line,) = watch_lines(Msg(TOPICS.dlq, future.SerializeToString(), headers, key=b"t-1"), TOPICS)
    assert line["reason"] == "callback-topic-not-allowed"
    assert line["error"] == "'orders' is not allowed"
    assert line["source"] == {"topic": "timer-request", "partition": 3, "offset": 42}
    request = line["request"]
    assert (request["kind"], request["id"], request["callback_topic"], request["payload"]) == (
        "future",
        "t-1",
        "orders",
        "v",
    )
    assert request["has_token"] is True
    assert "secret" not in json.dumps(line)  # the receiver's secret is not printed


def test_a_dead_letter_is_recognised_by_its_headers_on_any_topic():
    cancel = Cancel(id="c").SerializeToString()
    headers = [("kt-kind", b"cancel"), ("kt-reason", b"missing-id"), ("kt-truncated", b"value,headers")]
    (line,) = watch_lines(Msg("my-copy-of-the-dlq", cancel, headers), TOPICS)
    assert line["request"] == {"kind": "cancel", "id": "c"}
    assert line["truncated"] == ["value", "headers"]


def test_a_dead_letter_that_is_no_request_keeps_its_bytes():
    (line,) = watch_lines(Msg(TOPICS.dlq, b"\xff\xff", [("kt-reason", b"undecodable")]), TOPICS)
    assert line["value"] == "b'\\xff\\xff'"
    assert line["decode_error"].startswith("not a Future")


def test_requests_are_decoded_with_their_recurrence():
    future = Future(
        callBackTopic="t", callBackKey="k", id="s", due_ms=60_000, recurrence=Recurrence(interval_ms=60_000)
    )
    batch = FutureBatch(futures=[future]).SerializeToString()
    (line,) = watch_lines(Msg(TOPICS.request, batch, [("kt-kind", b"batch")]), TOPICS)
    (timer,) = line["request"]["timers"]
    assert timer["recurrence"]["interval_ms"] == 60_000
    assert timer["due"] == "1970-01-01T00:01:00.000Z"


def test_raw_output_stays_available_and_callbacks_are_not_decoded():
    msg = Msg("orders", b"hello", [("kt-due-ms", b"1000")], timestamp_ms=1500)
    assert watch_lines(msg, TOPICS) == [record_json(msg)]
    assert record_json(msg)["lateness_ms"] == 500


def test_a_due_time_out_of_every_range_prints_without_a_date():
    msg = Msg("orders", b"v", [("kt-due-ms", b"99999999999999999999")], timestamp_ms=5)
    assert record_json(msg)["due"] is None


HEADER_NAMES = st.sampled_from(
    [
        "kt-kind",
        "kt-reason",
        "kt-source-partition",
        "kt-source-offset",
        "kt-due-ms",
        "kt-fired-ms",
        "kt-truncated",
    ]
)
HEADER_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=30),
    st.sampled_from([b"batch", b"cancel", b"future", b"-1", b"99999999999999999999999", b"1e3"]),
    st.integers().map(lambda n: str(n).encode()),
)
VALID = st.sampled_from(
    [
        TimerEventBatch(fired=[FiredTimers(id=["a"], due_ms=[1], source_offset=[2])]).SerializeToString(),
        TimerEvent(id="a", kind=7, due_ms=-5, at_ms=2**62).SerializeToString(),
        Future(id="x", due_ms=2**62, callBack=b"\xff").SerializeToString(),
        FutureBatch(futures=[Future(id="y")]).SerializeToString(),
        Cancel(id="z").SerializeToString(),
    ]
)


@FUZZ
@given(
    topic=st.sampled_from([TOPICS.events, TOPICS.dlq, TOPICS.request, "orders"]),
    value=st.one_of(st.none(), st.binary(max_size=200), mutated(VALID), VALID),
    headers=st.lists(st.tuples(HEADER_NAMES | st.text(max_size=5), HEADER_VALUES), max_size=5),
    key=st.one_of(st.none(), st.binary(max_size=10)),
    timestamp=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
def test_any_record_gives_printable_lines(topic, value, headers, key, timestamp):
    lines = watch_lines(Msg(topic, value, headers, key, timestamp), TOPICS)
    assert lines
    for line in lines:
        json.dumps(line, ensure_ascii=False)
        assert (line["partition"], line["offset"]) == (1, 7)


@FUZZ
@given(st.integers(-(2**70), 2**70))
def test_iso_ms_of_any_number(epoch_ms):
    shown = decode.iso_ms(epoch_ms)
    assert shown is None or (len(shown) == 24 and shown.endswith("Z"))
