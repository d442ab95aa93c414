"""The client library and the CLI against a real broker: the records on the request topic."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from futures.cli import main
from futures.client import AsyncTimerClient, TimerClient
from ktimers.config import CommonConfig
from ktimers.errors import DeliveryError
from ktimers.wire import KIND_CANCEL, KIND_FUTURE, KIND_HEADER, Cancel, Future

pytestmark = pytest.mark.integration

GUARD_MARK = "tk-1"  # a cancellation token (not a secret)
UNREACHABLE = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500}


def consume(common: CommonConfig, topic: str, expected: int, timeout_s: float = 15.0) -> list[Message]:
    """Every record of ``topic`` from the start, until ``expected`` arrived."""
    consumer = Consumer(
        {
            **common.kafka.librdkafka(),
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        # assign() rather than subscribe(): no group join to wait for.
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                records.append(msg)
        assert len(records) == expected, f"got {len(records)} of {expected} records from {topic}"
        return records
    finally:
        consumer.close()


def decode_future(msg: Message) -> Future:
    future = Future()
    future.ParseFromString(msg.value() or b"")
    return future


def test_schedule_and_cancel_records_on_the_request_topic(common):
    with TimerClient(common) as client:
        kept = client.schedule(
            "orders",
            "order-42",
            b"\x00remind",
            delay=3600,
            token=GUARD_MARK,
            headers=[("b", b"2"), ("a", "1")],
        )
        cancelled = client.schedule("orders", "order-43", "bye", at=1_900_000_000.5, id="order-43-reminder")
        client.cancel(cancelled)

    records = consume(common, common.topics.request, expected=3)
    by_kind: dict[bytes, list[Message]] = {}
    for msg in records:
        kind = dict(msg.headers() or [])[KIND_HEADER]
        by_kind.setdefault(kind, []).append(msg)

    futures = {m.key(): m for m in by_kind[KIND_FUTURE]}
    assert set(futures) == {kept.id.encode(), b"order-43-reminder"}
    first = decode_future(futures[kept.id.encode()])
    assert (first.callBackTopic, first.callBackKey, first.callBack) == ("orders", "order-42", b"\x00remind")
    assert first.id == kept.id
    assert first.due_ms == kept.due_ms
    assert (first.token, kept.token) == (GUARD_MARK, GUARD_MARK)
    assert [(h.key, h.value) for h in first.headers] == [("b", b"2"), ("a", b"1")]
    second = decode_future(futures[b"order-43-reminder"])
    assert second.due_ms == 1_900_000_000_500
    assert not second.token and not second.headers

    (cancel,) = by_kind[KIND_CANCEL]
    assert cancel.key() == b"order-43-reminder"
    decoded = Cancel()
    decoded.ParseFromString(cancel.value() or b"")
    assert decoded.id == "order-43-reminder"
    # Same key, same partition: the worker sees the cancel after the timer it names.
    assert cancel.partition() == futures[b"order-43-reminder"].partition()
    assert cancel.offset() > futures[b"order-43-reminder"].offset()


def test_async_client_returns_handles_after_the_ack(common):
    async def scenario():
        async with AsyncTimerClient(common) as client:
            handles = await asyncio.gather(
                *(client.schedule("orders", f"k{i}", f"v{i}", delay=60, id=f"async-{i}") for i in range(5))
            )
            await client.cancel(handles[0])
            return handles

    handles = asyncio.run(scenario())
    assert [h.id for h in handles] == [f"async-{i}" for i in range(5)]

    records = consume(common, common.topics.request, expected=6)
    keys = sorted(m.key() for m in records)
    assert keys == sorted([b"async-0", b"async-0", b"async-1", b"async-2", b"async-3", b"async-4"])
    values = {
        decode_future(m).callBack for m in records if dict(m.headers() or [])[KIND_HEADER] == KIND_FUTURE
    }
    assert values == {f"v{i}".encode() for i in range(5)}


def test_unreachable_broker_raises_delivery_error_on_flush(common):
    client = TimerClient(common, producer_config=UNREACHABLE)
    handle = client.schedule("orders", "k", "v", delay=1)
    started = time.monotonic()
    with pytest.raises(DeliveryError, match=f"timer {handle.id} was not delivered to Kafka"):
        client.flush(timeout=10)
    assert time.monotonic() - started < 8  # message.timeout.ms, not the flush timeout, decided


def test_async_unreachable_broker_raises_from_schedule(common):
    async def scenario():
        async with AsyncTimerClient(common, producer_config=UNREACHABLE) as client:
            with pytest.raises(DeliveryError, match="Message timed out"):
                await client.schedule("orders", "k", "v", delay=1, id="lost")

    asyncio.run(scenario())


def test_cli_schedule_then_watch_round_trip(timers_env, monkeypatch, capsys):
    for name, value in timers_env.items():
        monkeypatch.setenv(name, value)
    request_topic = timers_env["TIMERS_TOPIC_REQUEST"]

    assert main(["topics", "check"]) == 0
    assert "exist with 4 partitions" in capsys.readouterr().out

    code = main(
        ["schedule", "--topic", "orders", "--key", "k", "--value", "hello", "--delay", "2m", "--id", "cli-1"]
    )
    scheduled = json.loads(capsys.readouterr().out)
    assert code == 0 and scheduled["id"] == "cli-1"

    code = main(["watch", request_topic, "--from-beginning", "--count", "1", "--timeout", "10s"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["key"] == "cli-1"
    assert shown["headers"] == {KIND_HEADER: KIND_FUTURE.decode()}

    # Nothing more arrives: --count is not reached before --timeout.
    code = main(["watch", request_topic, "--count", "1", "--timeout", "500ms"])
    assert code == 1
    assert "timed out after 0.5s with 0 of 1 records" in capsys.readouterr().err


def test_cli_topics_create_and_check_name_the_ingress_topics(timers_env, unique, monkeypatch, capsys):
    for name, value in timers_env.items():
        monkeypatch.setenv(name, value)
    schedules = unique("schedules")
    monkeypatch.setenv("TIMERS_INGRESS_TOPICS", f"{schedules}=etf1")

    assert main(["topics", "create"]) == 0
    out = capsys.readouterr().out
    assert f"created: {schedules}" in out
    assert f"{schedules} (etf1)" in out
    assert main(["topics", "check"]) == 0
    assert f"{schedules} (etf1) exist with 4 partitions" in capsys.readouterr().out
