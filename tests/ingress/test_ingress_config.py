"""Which topics carry which format: parsing TIMERS_INGRESS_TOPICS, and the topic layout it implies."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from ktimers.config import CommonConfig, IngressFormat, TopicsConfig
from ktimers.errors import ConfigError, TopicLayoutError
from ktimers.topics import create_topics, verify_topics


def test_ingress_topics_and_their_formats():
    topics = TopicsConfig.from_env({"TIMERS_INGRESS_TOPICS": " schedules = ETF1 , delays=countdown,,"})
    assert topics.ingress == (("schedules", IngressFormat.ETF1), ("delays", IngressFormat.COUNTDOWN))
    assert topics.ingress_formats == {
        "timer-request": IngressFormat.NATIVE,
        "schedules": IngressFormat.ETF1,
        "delays": IngressFormat.COUNTDOWN,
    }
    assert topics.format_of("delays") is IngressFormat.COUNTDOWN
    assert topics.format_of("timer-events") is None
    # A timer must not be able to forge requests: ingress topics are never callback targets.
    assert {"schedules", "delays"} <= topics.own
    assert TopicsConfig.from_env({}).ingress == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("schedules", "not topic=format"),
        ("schedules=", "not topic=format"),
        ("=etf1", "not topic=format"),
        ("schedules=kafka-streams", "unknown format.*native, etf1, countdown"),
        ("a=etf1,a=countdown", "listed twice"),
        ("timer-events=etf1", "already one of the service's topics"),
    ],
)
def test_bad_ingress_settings_say_what_is_wrong(raw, message):
    with pytest.raises(ConfigError, match=message):
        TopicsConfig.from_env({"TIMERS_INGRESS_TOPICS": raw})


@pytest.mark.integration
def test_ingress_topics_are_created_and_must_be_co_partitioned(
    broker_env: dict[str, str], unique: Callable[[str], str]
):
    env = {
        **broker_env,
        "TIMERS_TOPIC_OSCILLATOR": unique("oscillator"),
        "TIMERS_TOPIC_REQUEST": unique("timer-request"),
        "TIMERS_TOPIC_EVENTS": unique("timer-events"),
        "TIMERS_TOPIC_DLQ": unique("timer-request-dlq"),
        "TIMERS_PARTITIONS": "3",
        "TIMERS_INGRESS_TOPICS": f"{unique('schedules')}=etf1",
    }
    common = CommonConfig.from_env(env)
    assert unique("schedules") in create_topics(common)
    assert verify_topics(common) == 3

    skewed = unique("skewed")
    admin = AdminClient(common.kafka.librdkafka())
    admin.create_topics([NewTopic(skewed, 2, 1)])[skewed].result()
    bad = CommonConfig.from_env({**env, "TIMERS_INGRESS_TOPICS": f"{skewed}=countdown"})
    with pytest.raises(TopicLayoutError, match=f"{skewed}.*2 partitions.*3"):
        verify_topics(bad)
