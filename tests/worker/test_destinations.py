"""CallbackTopics answers from memory; lookups happen in the background."""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaError

from futures.worker.destinations import CallbackTopics


class Cluster:
    """Topics that exist; a lookup can be held until the test lets it go."""

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)
        self.gate = threading.Event()
        self.gate.set()
        self.lookups: list[str | None] = []

    def lookup(self, topic: str | None) -> bool | set[str]:
        self.lookups.append(topic)
        self.gate.wait(5)
        return set(self.topics) if topic is None else topic in self.topics


def _eventually(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_topics_listed_at_start_are_ready_at_once():
    topics = CallbackTopics(Cluster("orders").lookup)
    _eventually(lambda: topics.problem("orders") is None)
    topics.close()


def test_an_unknown_topic_is_retriable_while_looked_up_then_known():
    cluster = Cluster("orders")
    topics = CallbackTopics(cluster.lookup)
    _eventually(lambda: topics.problem("orders") is None)
    cluster.topics.add("created-later")
    cluster.gate.clear()  # the lookup takes a while: the answer must not wait for it
    started = time.monotonic()
    problem = topics.problem("created-later")
    assert time.monotonic() - started < 0.5
    assert problem is not None and problem.retriable()
    cluster.gate.set()
    _eventually(lambda: topics.problem("created-later") is None)
    topics.close()


def test_a_missing_topic_is_a_permanent_problem_until_refreshed():
    now = [0.0]
    cluster = Cluster()
    topics = CallbackTopics(cluster.lookup, refresh_s=30, clock=lambda: now[0])
    topics.problem("nope")
    _eventually(lambda: topics.problem("nope") is not None and not topics.problem("nope").retriable())
    problem = topics.problem("nope")
    assert problem.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # Created meanwhile: once the verdict is stale it is looked up again, and never dead-lettered on old news.
    cluster.topics.add("nope")
    now[0] = 31
    assert topics.problem("nope").retriable()
    _eventually(lambda: topics.problem("nope") is None)
    assert cluster.lookups.count("nope") == 2
    topics.close()


def test_a_failing_lookup_is_tried_again():
    calls = []

    def flaky(topic):
        calls.append(topic)
        if len(calls) < 3:
            raise RuntimeError("broker unreachable")
        return True

    topics = CallbackTopics(flaky)
    _eventually(lambda: topics.problem("t") is None)
    assert calls.count("t") >= 2
    topics.close()
