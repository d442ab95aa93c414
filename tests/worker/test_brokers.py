"""The worker's view of its brokers: lost and back, each said once, and what /readyz answers."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from futures.worker.brokers import BrokerWatch
from ktimers.config import KafkaConfig


class Answers:
    """Metadata requests that fail while ``down`` is set."""

    def __init__(self) -> None:
        self.down = False
        self.asked: list[str | None] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self.asked.append(topic)
        if self.down:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out")
            )
        return object()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers, clock = Answers(), Clock()
    watch = BrokerWatch(KafkaConfig(bootstrap_servers="b1:9092"), "timer-request", admin=answers, clock=clock)

    with caplog.at_level(logging.INFO, logger="futures.worker.brokers"):
        watch.check()
        assert (watch.reachable, watch.reason) == (True, "")
        answers.down = True
        for _ in range(30):  # a minute of checks every 2 s
            clock.now += 2.0
            watch.check()
            assert not watch.reachable
        assert watch.reason == "cannot reach Kafka at b1:9092: Failed to get metadata: Local: Timed out"
        answers.down = False
        clock.now += 2.0
        watch.check()

    assert watch.reachable
    [lost, back] = [r.getMessage() for r in caplog.records]
    assert lost.startswith("futures worker lost its brokers: cannot reach Kafka at b1:9092")
    assert back == "futures worker reaches its brokers at b1:9092 again, after 60.0s"
    # One topic it reads anyway, never all of a cluster's metadata every two seconds.
    assert set(answers.asked) == {"timer-request"}
