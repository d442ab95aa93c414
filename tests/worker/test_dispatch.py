"""The dispatcher's memory of callback topics does not grow with the names requests carry, a
failed delivery report is traced to the callbacks it may be of, and a callbacks producer the
brokers refuse is replaced."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError

from futures.worker.callback_queue import CallbackQueue
from futures.worker.callbacks import Callback
from futures.worker.destinations import MAX_TOPICS
from futures.worker.dispatch import Dispatcher, traced_errors
from futures.worker.kafka import Deliveries, KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import WorkerStatus
from ktimers.config import TopicsConfig
from tests.worker.fakes import FakeMessage, FakeProducer, FakeTopics, Sent, transient_error


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
        dispatcher.scheduled(n % 4, 0, [f"timer-{n}"], [1_000], [n], [topic])

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


def _callback(timer_id: str, topic: str, key: bytes, value: bytes) -> Callback:
    return Callback(b"t" + timer_id.encode(), 0, topic, key, value, timer_id, 0, 0, b"", b"", (), b"")


def test_a_failure_is_traced_by_the_record_its_report_names_and_one_naming_none_fails_them_all() -> None:
    callbacks = [
        _callback("a", "orders", b"k", b"1"),
        _callback("b", "orders", b"k", b"2"),
        _callback("c", "audit", b"k", b"1"),
        _callback("d", "orders", b"", b""),
    ]
    producer = FakeProducer(fail=lambda topic: transient_error() if topic == "audit" else None)
    deliveries = Deliveries()
    writer = KafkaWriter(producer)
    for c in callbacks:
        writer.produce(c.topic, c.record_key, c.value, deliveries=deliveries)
    producer.flush()
    # "c" alone, though "a" shares its key and value: a report names the topic too.
    assert list(traced_errors(callbacks, deliveries)) == [2]

    # A key and a value left empty are named as None by librdkafka: still "d".
    empty = Deliveries()
    empty.failed.append((transient_error(), FakeMessage(Sent("orders", None, None, None, [], 0), 0, None)))
    assert list(traced_errors(callbacks, empty)) == [3]

    unnamed = Deliveries()
    unnamed.failed.append((transient_error(), None))
    assert sorted(traced_errors(callbacks, unnamed)) == [0, 1, 2, 3]


@pytest.mark.parametrize("wrong", ["not a callback", ("too", "short"), None])
def test_the_compiled_callback_queue_refuses_what_is_no_callback_instead_of_reading_past_it(
    wrong: object,
) -> None:
    queued: list[object] = []
    callbacks = CallbackQueue(lambda *record: queued.append(record), queued.append, lambda topic: None)
    with pytest.raises(TypeError, match="a Callback is needed"):
        callbacks.put(wrong, b"1", Deliveries(), 0, {})  # type: ignore[arg-type]
    assert queued == []


FENCED = KafkaError(
    KafkaError.PRODUCER_FENCED,
    "Broker: There is a newer producer with the same transactionalId which fences the current one",
)


def test_callbacks_a_fenced_producer_refused_are_kept_and_sent_by_a_new_producer() -> None:
    # After a broker outage the embedded broker fenced a producer whose records had timed out,
    # for good: its callbacks must neither be dead-lettered nor wait for a restart.
    made: list[FakeProducer] = []

    def new_callbacks() -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]

    fenced = FakeProducer(fail=lambda topic: FENCED)
    writer = KafkaWriter(FakeProducer(), callbacks=fenced, new_callbacks=new_callbacks)
    dispatcher = Dispatcher(
        TopicsConfig(),
        writer,
        WorkerMetrics(),
        WorkerStatus(),
        lambda: 0,
        FakeTopics(),
        stored=lambda c: None,
    )
    callbacks = [_callback("a", "orders", b"k", b"1"), _callback("b", "orders", b"k", b"2")]

    refused = asyncio.run(dispatcher.confirm(dispatcher.send(callbacks, fired_ms=1_000)))
    assert (refused.done, refused.transient, refused.dead_lettered) == ([], [0, 1], 0)

    resent = asyncio.run(dispatcher.confirm(dispatcher.send(callbacks, fired_ms=2_000)))
    assert (resent.done, resent.transient) == ([0, 1], [])
    assert len(made) == 1
    assert [s.value for s in made[0].sent] == [b"1", b"2"]
