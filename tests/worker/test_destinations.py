"""CallbackTopics answers from memory; lookups list the cluster's topics in the background."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from confluent_kafka import KafkaError

from futures.worker.destinations import MAX_TOPICS, CallbackTopics
from futures.worker.metrics import WorkerMetrics


class Cluster:
    """Topics that exist; a listing can be held until the test lets it go."""

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)
        self.troubled: set[str] = set()  # listed with an error (no leader yet, say)
        self.gate = threading.Event()
        self.gate.set()
        self.listings = 0

    def listing(self) -> dict[str, bool]:
        # As a broker answers: what exists when the request arrives, delivered later.
        answer = {name: True for name in self.topics} | {name: False for name in self.troubled}
        self.listings += 1
        self.gate.wait(5)
        return answer


def _eventually(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _missing(problem: KafkaError | None) -> bool:
    return problem is not None and not problem.retriable()


def test_topics_listed_at_start_are_ready_at_once():
    topics = CallbackTopics(Cluster("orders").listing)
    _eventually(lambda: topics.problem("orders") is None)
    topics.close()


def test_an_unknown_topic_is_retriable_while_looked_up_then_known():
    cluster = Cluster("orders")
    topics = CallbackTopics(cluster.listing)
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
    topics = CallbackTopics(cluster.listing, refresh_s=30, clock=lambda: now[0])
    topics.problem("nope")
    _eventually(lambda: _missing(topics.problem("nope")))
    problem = topics.problem("nope")
    assert problem is not None and problem.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    listings = cluster.listings
    # Created meanwhile: once the verdict is stale it is looked up again, and never dead-lettered on old news.
    cluster.topics.add("nope")
    now[0] = 31
    problem = topics.problem("nope")
    assert problem is not None and problem.retriable()
    _eventually(lambda: topics.problem("nope") is None)
    assert cluster.listings == listings + 1
    topics.close()


def test_a_topic_created_while_a_listing_is_on_its_way_is_not_called_missing_by_it():
    cluster = Cluster()
    topics = CallbackTopics(cluster.listing)
    _eventually(lambda: cluster.listings == 1 and topics.waiting == 0)
    cluster.gate.clear()
    topics.problem("first")  # starts a listing, held on its way back
    _eventually(lambda: cluster.listings == 2)
    cluster.topics.add("second")
    topics.problem("second")  # asked after that listing left: it cannot answer for it
    cluster.gate.set()
    _eventually(lambda: _missing(topics.problem("first")))
    _eventually(lambda: topics.problem("second") is None)
    topics.close()


def test_a_topic_listed_with_an_error_is_neither_produced_to_nor_dead_lettered():
    cluster = Cluster()
    cluster.troubled.add("leaderless")
    topics = CallbackTopics(cluster.listing)
    topics.problem("leaderless")
    _eventually(lambda: cluster.listings >= 3)  # listed again and again while it is asked about
    problem = topics.problem("leaderless")
    assert problem is not None and problem.retriable()
    cluster.troubled.clear()
    cluster.topics.add("leaderless")
    _eventually(lambda: topics.problem("leaderless") is None)
    topics.close()


def test_a_failing_listing_is_tried_again():
    calls = []

    def flaky() -> dict[str, bool]:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("broker unreachable")
        return {"t": True}

    topics = CallbackTopics(flaky)
    _eventually(lambda: topics.problem("t") is None)
    assert len(calls) >= 3
    topics.close()


def test_a_producer_lists_every_topic_never_one_by_name():
    # Metadata asked for one topic creates it where brokers create topics on first use.
    asked = []

    class Producer:
        def list_topics(self, topic: str | None = None, timeout: float = -1) -> SimpleNamespace:
            asked.append(topic)
            ok, broken = SimpleNamespace(error=None), SimpleNamespace(error=KafkaError(5))
            return SimpleNamespace(topics={"orders": ok, "moving": broken})

    topics = CallbackTopics.of_producer(Producer())  # type: ignore[arg-type]
    _eventually(lambda: topics.problem("orders") is None)
    topics.problem("nope")
    topics.problem("moving")
    _eventually(lambda: _missing(topics.problem("nope")))
    assert topics.problem("moving") is not None and topics.problem("moving").retriable()
    assert set(asked) == {None}
    topics.close()


def test_requests_naming_ever_new_topics_leave_memory_at_the_bound():
    cluster = Cluster("orders")
    topics = CallbackTopics(cluster.listing)
    _eventually(lambda: topics.problem("orders") is None)
    waves = 5
    for wave in range(waves):  # each wave looked up before the next, as across ticks
        cluster.gate.clear()  # no listing comes back while the wave is asked
        for n in range(MAX_TOPICS + 100):  # more than wait at once: the last are asked again later
            topics.problem(f"new-{wave}-{n}")
        assert topics.waiting == MAX_TOPICS
        cluster.gate.set()
        _eventually(lambda: topics.waiting == 0)
        assert topics.remembered == MAX_TOPICS
    assert topics.forgotten == (waves - 1) * MAX_TOPICS + 1  # "orders" went first
    # Answers stay right: the latest as missing; one dropped while the queue was full, and one
    # forgotten, are looked up again when next asked about.
    assert _missing(topics.problem(f"new-{waves - 1}-{MAX_TOPICS - 1}"))
    for dropped in (f"new-{waves - 1}-{MAX_TOPICS}", "orders"):
        problem = topics.problem(dropped)
        assert problem is not None and problem.retriable()
    _eventually(lambda: _missing(topics.problem(f"new-{waves - 1}-{MAX_TOPICS}")))
    _eventually(lambda: topics.problem("orders") is None)
    assert topics.remembered == MAX_TOPICS
    topics.close()


def test_the_topics_asked_about_most_recently_are_kept():
    cluster = Cluster()
    topics = CallbackTopics(cluster.listing, max_topics=3)
    metrics = WorkerMetrics()
    metrics.watch_callback_topics(lambda: topics.forgotten)
    _eventually(lambda: cluster.listings == 1 and topics.waiting == 0)
    cluster.topics.update("abcd")
    for name in "abcd":  # d is looked up: a, asked about least recently, is forgotten
        _eventually(lambda name=name: topics.problem(name) is None)
    assert topics.remembered == 3 and topics.forgotten == 1
    assert metrics.registry.get_sample_value("timers_callback_topics_forgotten_total") == 1
    listings = cluster.listings
    for name in "bcd":
        assert topics.problem(name) is None
    assert cluster.listings == listings
    forgotten = topics.problem("a")
    assert forgotten is not None and forgotten.retriable()
    topics.close()
