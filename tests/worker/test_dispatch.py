"""The dispatcher's memory of callback topics does not grow with the names requests carry."""

from __future__ import annotations

from futures.worker.destinations import MAX_TOPICS
from futures.worker.dispatch import Dispatcher
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import WorkerStatus
from ktimers.config import TopicsConfig
from tests.worker.fakes import FakeProducer, FakeTopics


def test_requests_naming_ever_new_callback_topics_leave_memory_at_the_bound() -> None:
    directory = FakeTopics()
    dispatcher = Dispatcher(
        TopicsConfig(),
        KafkaWriter(FakeProducer()),
        WorkerMetrics(),
        WorkerStatus(),
        lambda: 0,
        directory,
        stored=lambda callback: None,
    )

    def accept(n: int, topic: str) -> None:
        dispatcher.scheduled(f"timer-{n}", 1_000, n % 4, n, topic, 0)

    many = 5 * MAX_TOPICS
    for n in range(many):
        accept(n, f"topic-{n}")
    # What it remembers: which topics it has handed to the directory to look up ahead.
    assert len(dispatcher._expected) == MAX_TOPICS
    assert len(directory.asked) == many  # each new topic handed over once, with its first timer
    accept(many, f"topic-{many - 1}")  # remembered: not handed over again
    assert len(directory.asked) == many
    accept(many + 1, "topic-0")  # forgotten: handed over again, with its next timer
    assert directory.asked[-1] == "topic-0"
    assert len(dispatcher._expected) == MAX_TOPICS
