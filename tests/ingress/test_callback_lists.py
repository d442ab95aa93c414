"""Each request topic's own list of callback topics: the syntax, the precedence, the dead letter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from futures.ingress.limits import NO_PAYLOAD_LIMIT
from futures.ingress.native import fast_parse
from futures.ingress.requests import RequestParser, Schedule
from futures.worker.config import WorkerConfig
from ktimers.config import IngressFormat, TopicsConfig
from ktimers.errors import ConfigError
from ktimers.wire import Future
from tests.ingress.helpers import NOW_MS, parse, record, rejected

REQUEST = "timer-request"
DUE_MS = 1_795_000_000_000
ENV = {
    "TIMERS_ALLOWED_CALLBACK_TOPICS": "orders-*",
    "TIMERS_REQUEST_ALLOWED_CALLBACK_TOPICS": "reminders, billing-*",
    "TIMERS_INGRESS_TOPICS": "team-a=native:team-a.*:audit,schedules=etf1,open=native:*",
}
LIMITS = WorkerConfig.from_env(ENV).parse_limits


def future(callback_topic: str) -> bytes:
    return Future(callBackTopic=callback_topic, id="t", due_ms=DUE_MS).SerializeToString()


def etf1(callback_topic: str) -> tuple[tuple[str, bytes], ...]:
    return (
        ("scheduler-epoch", b"1795000000"),
        ("scheduler-target-topic", callback_topic.encode()),
        ("scheduler-target-key", b"k"),
    )


def test_an_ingress_topic_names_its_own_patterns_after_its_format():
    topics = TopicsConfig.from_env({"TIMERS_INGRESS_TOPICS": "team-a = native : team-a.* : audit , s=etf1"})
    assert topics.ingress == (("team-a", IngressFormat.NATIVE), ("s", IngressFormat.ETF1))
    assert topics.ingress_callback_topics == (("team-a", ("team-a.*", "audit")),)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("team-a=native:", "'' is not a callback-topic pattern.*no ':' to use TIMERS_ALLOWED_CALLBACK"),
        ("team-a=native:a::b", "'' is not a callback-topic pattern"),
        ("team-a=native:team a", "'team a' is not a callback-topic pattern"),
        ("team-a=:x", "not topic=format"),
    ],
)
def test_bad_patterns_say_what_is_wrong(raw, message):
    with pytest.raises(ConfigError, match=message):
        TopicsConfig.from_env({"TIMERS_INGRESS_TOPICS": raw})


@pytest.mark.parametrize(
    ("topic", "allowed", "refused"),
    [
        (REQUEST, ["reminders", "billing-eu"], ["orders-1", "team-a.x"]),
        ("team-a", ["team-a.x", "audit"], ["orders-1", "reminders", "audit-2"]),
        ("open", ["anything", "orders-1"], ["_schemas", "timer-events", "__consumer_offsets"]),
    ],
)
def test_a_native_topic_with_its_own_list_allows_exactly_that_list(topic, allowed, refused):
    for callback_topic in allowed:
        [result] = parse(record(topic, future(callback_topic)), LIMITS)
        assert isinstance(result, Schedule), (topic, callback_topic, result)
    for callback_topic in refused:
        rejection = rejected(record(topic, future(callback_topic)), LIMITS)
        assert rejection.reason == "callback-topic-not-allowed", (topic, callback_topic)


def test_a_topic_without_its_own_list_takes_the_global_one():
    assert isinstance(parse(record("schedules", b"x", b"k", headers=etf1("orders-1")), LIMITS)[0], Schedule)
    rejection = rejected(record("schedules", b"x", b"k", headers=etf1("team-a.x")), LIMITS)
    assert rejection.reason == "callback-topic-not-allowed"
    assert rejection.detail == (
        "'team-a.x' is not allowed for request topic 'schedules': "
        "not in TIMERS_ALLOWED_CALLBACK_TOPICS=orders-*"
    )


def test_the_dead_letter_names_the_request_topic_and_the_list_it_broke():
    rejection = rejected(record("team-a", future("reminders")), LIMITS)
    assert rejection.detail == (
        "'reminders' is not allowed for request topic 'team-a': "
        "not in its own list team-a.*,audit (TIMERS_INGRESS_TOPICS)"
    )
    rejection = rejected(record(REQUEST, future("orders-1")), LIMITS)
    assert rejection.detail == (
        "'orders-1' is not allowed for request topic 'timer-request': "
        "not in its own list reminders,billing-* (TIMERS_REQUEST_ALLOWED_CALLBACK_TOPICS)"
    )


def test_without_lists_of_their_own_every_topic_takes_the_global_one():
    limits = WorkerConfig.from_env({"TIMERS_ALLOWED_CALLBACK_TOPICS": "orders-*"}).parse_limits
    assert limits.own_callback_topics == ()
    assert isinstance(parse(record(REQUEST, future("orders-1")), limits)[0], Schedule)
    assert rejected(record(REQUEST, future("reminders")), limits).reason == "callback-topic-not-allowed"


def test_the_fast_path_judges_by_the_records_own_topic():
    context = RequestParser(replace(LIMITS, max_payload_bytes=NO_PAYLOAD_LIMIT), NOW_MS).context
    value = future("reminders")
    assert fast_parse(None, value, context, REQUEST) == Future.FromString(value)
    assert fast_parse(None, value, context, "team-a") is None  # refused there: parse says why
