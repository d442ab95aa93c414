"""Every ingress format end to end on the embedded broker: schedule, update, delete, fire, dead-letter.

One worker serves the module, consuming `timer-request` (native), an etf1
schedules topic and a JSON countdown topic at once.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Message, Producer

from futures.client import TimerSpec
from futures.client.partitioner import crc32_partition, murmur2_partition
from ktimers.wire import Future, header_value
from tests.integration.conftest import Callback, Stack
from tests.integration.formats_stack import FormatsStack, dump_logs_on_failure, formats_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def formats(broker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[FormatsStack]:
    yield from formats_stack(broker_env, tmp_path_factory.mktemp("formats"))


@pytest.fixture(autouse=True)
def _logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "formats" in request.fixturenames:
        dump_logs_on_failure(request, request.getfixturevalue("formats").stack)


def user_headers(callback: Callback) -> list[tuple[str, bytes | None]]:
    """The callback's headers before ours (the worker appends kt-* last)."""
    return [(k, v) for k, v in callback.headers if not k.startswith("kt-")]


def dead_letters(stack: Stack, source_topic: str, n: int) -> list[Callback]:
    reader = stack.reader(stack.common.topics.dlq)

    def mine(records: list[Callback]) -> list[Callback]:
        return [r for r in records if header_value(r.headers, "kt-source-topic") == source_topic.encode()]

    reader.read_until(lambda r: len(mine(r)) >= n, timeout_s=20)
    return mine(reader.records)


def reasons(letters: list[Callback]) -> dict[bytes | None, str]:
    return {r.key: (header_value(r.headers, "kt-reason") or b"").decode() for r in letters}


def test_etf1_schedule_update_delete_fire_and_dead_letter(formats: FormatsStack) -> None:
    stack, topic = formats.stack, formats.etf1_topic
    reader = stack.callback_topic("etf1")
    due_s = int(time.time()) + 4
    sent_ms = int(time.time() * 1000) - 60_000  # the schedule record's own timestamp

    def schedule(key: bytes, value: bytes | None, epoch: int | bytes, **extra: bytes) -> None:
        headers = [
            ("scheduler-epoch", epoch if isinstance(epoch, bytes) else str(epoch).encode()),
            ("scheduler-target-topic", reader.topic.encode()),
            ("scheduler-target-key", b"target-" + key),
            *((k.replace("_", "-"), v) for k, v in extra.items()),
        ]
        formats.produce(topic, value, key, headers if value is not None else None, timestamp_ms=sent_ms)

    schedule(b"vid1-online", b"video 1", due_s, customer_header=b"dummy")
    schedule(b"vid2", b"old payload", due_s + 3600)  # updated below: latest wins
    schedule(b"vid2", b"new payload", due_s)
    schedule(b"vid3", b"never", due_s)  # deleted below by a tombstone
    schedule(b"vid3", None, due_s)
    formats.produce(
        topic, b"x", b"no-epoch", [("scheduler-target-topic", b"t"), ("scheduler-target-key", b"k")]
    )
    schedule(b"bad-epoch", b"x", b"tomorrow")
    formats.produce(topic, b"x", b"no-target", [("scheduler-epoch", str(due_s).encode())])

    reader.read_until(lambda r: len(r) >= 2, timeout_s=30)
    reader.poll(1.5)  # anything else (the deleted one, the old version) would arrive by now
    by_key = {c.key: c for c in reader.records}
    assert sorted(by_key) == [b"target-vid1-online", b"target-vid2"]
    assert len(reader.records) == 2

    vid1 = by_key[b"target-vid1-online"]
    assert vid1.value == b"video 1"
    assert user_headers(vid1) == [
        ("scheduler-epoch", str(due_s).encode()),
        ("scheduler-target-topic", reader.topic.encode()),
        ("scheduler-target-key", b"target-vid1-online"),
        ("customer-header", b"dummy"),
        ("scheduler-timestamp", str(sent_ms // 1000).encode()),
        ("scheduler-key", b"vid1-online"),
        ("scheduler-topic", topic.encode()),
    ]
    assert vid1.timer_id == f"{topic}:vid1-online"
    assert by_key[b"target-vid2"].value == b"new payload"
    for callback in reader.records:
        assert callback.due_ms == due_s * 1000
        assert callback.received_ms >= due_s * 1000, "fired early"

    letters = dead_letters(stack, topic, 3)
    assert reasons(letters) == {
        b"no-epoch": "missing-header",
        b"bad-epoch": "bad-due-time",
        b"no-target": "missing-header",
    }
    # Dead-lettered as sent: value and the schedule's own headers intact.
    assert all(r.value == b"x" for r in letters)


def test_countdown_fire_caller_service_and_dead_letter(formats: FormatsStack) -> None:
    stack, topic = formats.stack, formats.countdown_topic
    reader = stack.callback_topic("countdown")
    sent_ms = int(time.time() * 1000)
    at_s = sent_ms // 1000 + 4

    def request(body: object, key: bytes | None, headers: list[tuple[str, bytes]] | None = None) -> None:
        value = body if isinstance(body, bytes) else json.dumps(body).encode()
        formats.produce(topic, value, key, headers, timestamp_ms=sent_ms)

    request(
        {"topic": reader.topic, "message": "héllo", "countdown": 2},
        b"order-9",
        [("CALLER_SERVICE", b"billing")],
    )
    request({"topic": reader.topic, "message": "at a time", "at": at_s, "key": "k-at"}, b"ignored")
    request(b"{not json", b"bad-json")
    request({"topic": reader.topic, "countdown": 1}, b"no-message")
    request({"topic": reader.topic, "message": "m", "countdown": -5}, b"negative")

    reader.read_until(lambda r: len(r) >= 2, timeout_s=30)
    reader.poll(1.0)
    by_key = {c.key: c for c in reader.records}
    assert sorted(by_key) == [b"k-at", b"order-9"] and len(reader.records) == 2
    hello = by_key[b"order-9"]
    assert hello.value == "héllo".encode()
    assert user_headers(hello) == [("CALLER_SERVICE", b"billing")]
    assert hello.due_ms == sent_ms + 2000  # counted from the request record's timestamp
    assert by_key[b"k-at"].value == b"at a time"
    assert user_headers(by_key[b"k-at"]) == []
    assert by_key[b"k-at"].due_ms == at_s * 1000
    for callback in reader.records:
        assert callback.received_ms >= callback.due_ms, "fired early"

    assert reasons(dead_letters(stack, topic, 3)) == {
        b"bad-json": "undecodable",
        b"no-message": "missing-field",
        b"negative": "bad-due-time",
    }


def test_bulk_scheduled_timers_fire_once_and_cancel_by_id(formats: FormatsStack) -> None:
    stack = formats.stack
    reader = stack.callback_topic("bulk")
    n = 3000
    start = time.time() + 5
    timers = [TimerSpec(reader.topic, f"k{i}", f"payload-{i}", at=start + 2.0 * i / n) for i in range(n)]
    timers.append(TimerSpec("not-allowed-topic", "k", "refused", at=start, id="refused-one"))
    with stack.client() as client:
        handles = client.schedule_many(timers, batch_size=500)
        cancelled = handles[:n:30]  # 100 timers, cancelled by handle: keyed by id, like any cancel
        for handle in cancelled:
            client.cancel(handle)
    due = {h.id: h.due_ms for h in handles[:n]}
    expected = set(due) - {h.id for h in cancelled}

    reader.read_until(lambda r: len(r) >= len(expected), timeout_s=40)
    reader.poll(1.5)
    counts = Counter(c.timer_id for c in reader.records)
    missing, extra = expected - set(counts), set(counts) - expected
    assert not missing and not extra, f"{len(missing)} never fired, {len(extra)} should not have fired"
    assert max(counts.values()) == 1
    assert all(c.received_ms >= due[c.timer_id] for c in reader.records), "fired early"
    assert all(c.value == f"payload-{c.key.decode()[1:]}".encode() for c in reader.records if c.key)

    [letter] = dead_letters(stack, stack.common.topics.request, 1)
    assert header_value(letter.headers, "kt-reason") == b"callback-topic-not-allowed"
    assert header_value(letter.headers, "kt-source-index") is not None
    assert Future.FromString(letter.value or b"").id == "refused-one"  # resendable as a single Future


@pytest.mark.parametrize(
    ("partitioner", "expected"),
    [(None, crc32_partition), ("murmur2_random", murmur2_partition)],
)
def test_the_client_computes_the_partition_the_producer_picks(
    formats: FormatsStack, partitioner: str | None, expected
) -> None:
    # schedule_many relies on this to put each timer where its cancel will go.
    conf = {"bootstrap.servers": formats.stack.bootstrap}
    if partitioner:
        conf["partitioner"] = partitioner
    producer = Producer(conf)
    landed: dict[bytes, int] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        landed[msg.key()] = msg.partition()

    topic = formats.stack.callback_topic("partitioner", partitions=4).topic
    for i in range(200):
        producer.produce(topic, b"", f"timer-{i}".encode(), on_delivery=delivered)
    assert producer.flush(10) == 0
    assert landed == {key: expected(key, 4) for key in landed} and len(landed) == 200


def test_every_ingress_topic_is_applied_once_across_a_crash(formats: FormatsStack) -> None:
    stack = formats.stack
    reader = stack.callback_topic("crash-formats")
    due_s = int(time.time()) + 12
    for i in range(50):
        formats.produce(
            formats.etf1_topic,
            b"etf1-%d" % i,
            b"s-%d" % i,
            [
                ("scheduler-epoch", str(due_s).encode()),
                ("scheduler-target-topic", reader.topic.encode()),
                ("scheduler-target-key", b"e%d" % i),
            ],
        )
        body = {"topic": reader.topic, "message": f"cd-{i}", "at": due_s, "key": f"c{i}"}
        formats.produce(formats.countdown_topic, json.dumps(body).encode(), b"c")
    with stack.client() as client:
        client.schedule_many([TimerSpec(reader.topic, f"n{i}", f"native-{i}", at=due_s) for i in range(50)])
    stack.wait_for_metric("timers_scheduled_total", lambda v: v >= 150, timeout_s=20)
    assert stack.worker is not None
    # Killed before Faust committed the consumed offsets: the restart reads the records again.
    stack.worker.kill()
    stack.start_worker()
    reader.read_until(lambda r: len(r) >= 150, timeout_s=60)
    reader.poll(2.0)
    counts = Counter(c.key for c in reader.records)
    assert len(counts) == 150 and max(counts.values()) == 1, counts.most_common(3)
    skipped = stack.metric_sum("timers_requests_skipped_total")
    # A few callback topics, far within the directory's bound: none forgotten, and the worker says so.
    assert stack.metrics().get("timers_callback_topics_forgotten_total") == 0
    print(f"\nrestart re-read and skipped {skipped:.0f} already-applied request records")
