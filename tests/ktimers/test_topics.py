"""Creating and checking the service's topics on a real broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from ktimers.config import CommonConfig
from ktimers.errors import TopicLayoutError
from ktimers.topics import create_topics, verify_topics

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh(broker_env: dict[str, str], unique: Callable[[str], str]) -> CommonConfig:
    """Config for four topic names nobody has created yet, 3 partitions each."""
    return CommonConfig.from_env(
        {
            **broker_env,
            "TIMERS_TOPIC_OSCILLATOR": unique("oscillator"),
            "TIMERS_TOPIC_REQUEST": unique("timer-request"),
            "TIMERS_TOPIC_EVENTS": unique("timer-events"),
            "TIMERS_TOPIC_DLQ": unique("timer-request-dlq"),
            "TIMERS_PARTITIONS": "3",
        }
    )


def make_topics(common: CommonConfig, partitions: dict[str, int]) -> None:
    """Create topics behind the service's back, with the given partition counts."""
    admin = AdminClient(common.kafka.librdkafka())
    replication = common.kafka.settings.replication_factor
    futures = admin.create_topics(
        [NewTopic(name, count, replication) for name, count in partitions.items()], operation_timeout=10
    )
    for future in futures.values():
        future.result()


def partition_counts(common: CommonConfig) -> dict[str, int]:
    metadata = AdminClient(common.kafka.librdkafka()).list_topics(timeout=10)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def test_create_topics_is_idempotent(fresh: CommonConfig) -> None:
    t = fresh.topics
    names = {t.oscillator, t.request, t.events, t.dlq}

    assert set(create_topics(fresh)) == names
    assert create_topics(fresh) == []

    assert verify_topics(fresh) == 3
    counts = partition_counts(fresh)
    assert {name: counts[name] for name in names} == dict.fromkeys(names, 3)


def test_create_topics_completes_a_half_set_up_cluster(fresh: CommonConfig) -> None:
    t = fresh.topics
    make_topics(fresh, {t.oscillator: 3, t.request: 3})

    assert sorted(create_topics(fresh)) == sorted([t.events, t.dlq])
    assert verify_topics(fresh) == 3


def test_oscillator_partitions_must_match_the_request_topic(fresh: CommonConfig) -> None:
    t = fresh.topics
    make_topics(fresh, {t.oscillator: 2, t.request: 4, t.events: 4, t.dlq: 4})

    with pytest.raises(TopicLayoutError) as info:
        verify_topics(fresh)

    message = str(info.value)
    assert f"{t.oscillator!r} has 2 partitions" in message
    assert f"{t.request!r} has 4" in message
    assert "timers topics create --partitions 4" in message
    # create_topics finds nothing to create, and still refuses the layout.
    with pytest.raises(TopicLayoutError, match="timers topics create --partitions 4"):
        create_topics(fresh)


def test_missing_topics_are_named_with_the_command_that_creates_them(fresh: CommonConfig) -> None:
    t = fresh.topics
    make_topics(fresh, {t.oscillator: 3, t.request: 3})

    with pytest.raises(TopicLayoutError) as info:
        verify_topics(fresh)

    message = str(info.value)
    assert f"missing topic(s) {t.events}, {t.dlq} on {fresh.kafka.bootstrap_servers}" in message
    assert "timers topics create --partitions 3" in message
    assert t.oscillator not in message and t.request not in message
