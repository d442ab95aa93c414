"""What ``timers deadletter resend`` sends: the rejected record as it was sent, to where it came
from; never a dead letter the worker cut down, nor one that holds no request."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futures.console.resend import DeadLetter, Resend, ResendError, callback_topic_of, plan
from ktimers.wire import Future
from tests.ingress.fuzzing import FUZZ

WORKER_HEADERS = [
    ("kt-reason", b"due-too-far"),
    ("kt-error", b"due in 900 days"),
    ("kt-source-topic", b"timer-request"),
    ("kt-source-partition", b"2"),
    ("kt-source-offset", b"17"),
]


def letter(headers, value=b"v") -> DeadLetter:
    return DeadLetter("timer-request-dlq", 0, 5, b"key", value, headers)


def test_the_record_goes_back_as_it_was_sent_to_its_source_topic() -> None:
    sent = [("kt-kind", b"future"), ("trace", b"abc")]
    assert plan(letter([*sent, *WORKER_HEADERS]), None) == Resend("timer-request", b"key", b"v", sent)
    assert plan(letter(WORKER_HEADERS), "other-requests").topic == "other-requests"


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([("kt-kind", b"future")], "is not a dead letter (no kt-reason header)"),
        ([*WORKER_HEADERS, ("kt-truncated", b"value")], "the worker cut this dead letter to fit"),
        ([("kt-reason", b"unreadable-timer"), ("kt-source-topic", b"t")], "not a request: nothing to resend"),
        ([("kt-reason", b"undecodable")], "names no kt-source-topic: give --to TOPIC"),
    ],
)
def test_what_cannot_be_resent_says_why(headers, message) -> None:
    with pytest.raises(ResendError, match=re.escape(message)):
        plan(letter(headers), None)


def test_the_callback_topic_of_an_undeliverable_timer() -> None:
    future = Future(id="t", callBackTopic="orders").SerializeToString()
    headers = [("kt-reason", b"callback-undeliverable"), ("kt-source-topic", b"timer-request")]
    assert callback_topic_of(letter(headers, future)) == "orders"
    assert callback_topic_of(letter(headers, b"\xff")) is None
    assert callback_topic_of(letter(WORKER_HEADERS, future)) is None


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["kt-reason", "kt-truncated", "kt-source-topic", "kt-kind"])
            | st.text(max_size=5),
            st.none()
            | st.binary(max_size=20)
            | st.sampled_from([b"unreadable-timer", b"callback-undeliverable"]),
        ),
        max_size=6,
    ),
    st.none() | st.binary(max_size=50),
    st.none() | st.text(max_size=5),
)
def test_any_record_gives_a_plan_or_a_reason(headers, value, to) -> None:
    record = letter(headers, value)
    try:
        planned = plan(record, to)
    except ResendError:
        return
    assert planned.value == value
    assert all(not k.startswith("kt-") or k == "kt-kind" for k, _ in planned.headers)
    callback_topic_of(record)
