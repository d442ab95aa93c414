"""Unit tests of the client library: the records it produces and how it reports failures.

A fake producer stands in for confluent-kafka, so no broker is needed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from futures.client import AsyncTimerClient, TimerClient, TimerHandle
from ktimers.config import CommonConfig, TopicsConfig
from ktimers.errors import DeliveryError, TimersError
from ktimers.wire import (
    IDS_HEADER,
    IDS_NEW,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    MAX_ID_BYTES,
    Cancel,
    Future,
)

REPO = Path(__file__).resolve().parents[2]
COMMON = CommonConfig(topics=TopicsConfig(request="req-topic"))
NOW = 1_800_000_000.25  # epoch seconds, fixed clock
GUARD_MARK = "tok-1"  # a cancellation token (not a secret)


@dataclass
class Produced:
    topic: str
    key: bytes
    value: bytes
    headers: list


@dataclass
class FakeProducer:
    """Records produced records; delivers reports on poll/flush like librdkafka.

    ``fail_next`` makes the next produced record fail with that error; ``hold``
    keeps reports back (a broker that has not acknowledged yet).
    """

    records: list[Produced] = field(default_factory=list)
    fail_next: KafkaError | None = None
    hold: bool = False
    _queue: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(
        self,
        topic,
        value=None,
        key=None,
        partition=-1,
        callback=None,
        on_delivery=None,
        timestamp=0,
        headers=None,
    ):
        on_delivery = on_delivery or callback
        with self._lock:
            self.records.append(Produced(topic, key, value, list(headers or [])))
            self._queue.append((on_delivery, self.fail_next))
            self.fail_next = None

    def _deliver(self) -> int:
        with self._lock:
            if self.hold:
                return 0
            queue, self._queue = self._queue, []
        for callback, err in queue:
            callback(err, object())
        return len(queue)

    def poll(self, timeout=-1):
        served = self._deliver()
        if not served and timeout > 0:
            time.sleep(min(timeout, 0.01))
        return served

    def flush(self, timeout=-1):
        self._deliver()
        with self._lock:
            return len(self._queue)


def timed_out() -> KafkaError:
    return KafkaError(KafkaError._MSG_TIMED_OUT)


def future_of(record: Produced) -> Future:
    future = Future()
    future.ParseFromString(record.value)
    return future


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


@pytest.fixture
def client(producer: FakeProducer) -> TimerClient:
    return TimerClient(COMMON, producer=producer, clock=lambda: NOW)


def test_schedule_produces_a_future_keyed_by_its_id(client, producer):
    handle = client.schedule(
        "orders", "order-42", b"\x00remind", delay=90, token=GUARD_MARK, headers=[("b", b"2"), ("a", "1")]
    )

    (record,) = producer.records
    assert record.topic == "req-topic"
    assert record.key == handle.id.encode() == handle.record_key
    assert len(handle.id) == 32 and int(handle.id, 16) >= 0  # uuid4 hex
    assert record.headers == [(KIND_HEADER, KIND_FUTURE), (IDS_HEADER, IDS_NEW)]  # the id is drawn here
    future = future_of(record)
    assert future.callBackTopic == "orders"
    assert future.callBackKey == "order-42"
    assert future.callBack == b"\x00remind"
    assert future.id == handle.id
    assert future.HasField("due_ms") and future.due_ms == 1_800_000_090_250
    assert future.token == GUARD_MARK
    assert [(h.key, h.value) for h in future.headers] == [("b", b"2"), ("a", b"1")]
    assert handle == TimerHandle(
        id=handle.id,
        record_key=handle.id.encode(),
        due_ms=1_800_000_090_250,
        callback_topic="orders",
        token=GUARD_MARK,
    )


def test_each_schedule_gets_a_new_id_a_uuid4_hex(client):
    first = client.schedule("orders", "k", "v", delay=1)
    second = client.schedule("orders", "k", "v", delay=1)
    assert first.id != second.id
    for handle in (first, second):
        parsed = uuid.UUID(hex=handle.id)
        assert parsed.hex == handle.id and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_given_id_is_the_record_key_and_no_token_leaves_the_field_empty(client, producer):
    handle = client.schedule("orders", b"k", "caf\u00e9", delay=0, id="order-42-reminder")
    (record,) = producer.records
    assert record.key == b"order-42-reminder"
    future = future_of(record)
    assert future.id == "order-42-reminder"
    assert future.callBackKey == "k"
    assert future.callBack == "caf\u00e9".encode()
    assert future.token == ""
    assert handle.token is None
    assert handle.due_ms == 1_800_000_000_250


@pytest.mark.parametrize(
    ("at", "due_ms"),
    [
        (datetime(2027, 1, 14, 8, 0, 0, 123000, tzinfo=UTC), 1_799_913_600_123),
        (datetime(2027, 1, 14, 9, 0, 0, 123000, tzinfo=timezone(timedelta(hours=1))), 1_799_913_600_123),
        (1_799_913_600.123, 1_799_913_600_123),
        (1_799_913_600, 1_799_913_600_000),
    ],
)
def test_at_is_converted_to_epoch_ms(client, at, due_ms):
    assert client.schedule("orders", "k", "v", at=at).due_ms == due_ms


def test_timedelta_delay_and_due_datetime(client):
    handle = client.schedule("orders", "k", "v", delay=timedelta(minutes=2))
    assert handle.due_ms == 1_800_000_120_250
    assert handle.due == datetime(2027, 1, 15, 8, 2, 0, 250000, tzinfo=UTC)


def test_real_clock_due_time_is_bounded_by_the_call(producer):
    client = TimerClient(COMMON, producer=producer)
    before = time.time()
    handle = client.schedule("orders", "k", "v", delay=5)
    after = time.time()
    assert round((before + 5) * 1000) <= handle.due_ms <= round((after + 5) * 1000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of at= "),
        ({"at": 1_800_000_000, "delay": 5}, "exactly one of at= "),
        ({"at": datetime(2027, 1, 1, 12, 0)}, "naive datetime"),
        ({"delay": -1}, "must be >= 0"),
        ({"delay": timedelta(seconds=-1)}, "must be >= 0"),
        ({"delay": float("nan")}, "not a finite number"),
        ({"delay": "5s"}, "expected a number of seconds"),
        ({"delay": 1, "headers": {"kt-token": b"forged"}}, "reserved"),
        ({"delay": 1, "id": ""}, "id must be a non-empty str"),
        ({"delay": 1, "token": ""}, "token must be a non-empty str"),
        # The worker would dead-letter it (invalid-id): one limit, MAX_ID_BYTES, on both sides.
        ({"delay": 1, "id": "é" * 257}, "longer than 512 bytes"),
    ],
)
def test_invalid_schedule_arguments_are_refused_before_producing(client, producer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        client.schedule("orders", "k", "v", **kwargs)
    assert producer.records == []


def test_the_longest_id_the_worker_accepts_is_accepted(client, producer):
    handle = client.schedule("orders", "k", "v", delay=1, id="i" * MAX_ID_BYTES)
    assert len(handle.record_key) == MAX_ID_BYTES
    assert len(producer.records) == 1


def test_callback_to_the_services_own_topic_is_refused(client, producer):
    with pytest.raises(ValueError, match="own topics"):
        client.schedule("req-topic", "k", "v", delay=1)
    assert producer.records == []


def test_non_utf8_callback_key_is_refused(client):
    with pytest.raises(ValueError, match="UTF-8"):
        client.schedule("orders", b"\xff\xfe", "v", delay=1)


def test_mapping_headers_keep_insertion_order(client, producer):
    client.schedule("orders", "k", "v", delay=1, headers={"z": "1", "a": b"\x00", "m": ""})
    assert [(h.key, h.value) for h in future_of(producer.records[0]).headers] == [
        ("z", b"1"),
        ("a", b"\x00"),
        ("m", b""),
    ]


def test_cancel_by_handle_uses_the_handles_record_key(client, producer):
    handle = client.schedule("orders", "k", "v", delay=60)
    client.cancel(handle)

    cancel = producer.records[1]
    assert cancel.topic == "req-topic"
    assert cancel.key == handle.record_key
    assert cancel.headers == [(KIND_HEADER, KIND_CANCEL)]
    decoded = Cancel()
    decoded.ParseFromString(cancel.value)
    assert decoded.id == handle.id


def test_cancel_by_id_defaults_the_key_to_the_id_or_takes_an_override(client, producer):
    client.cancel("abc")
    client.cancel("seed-1-7", record_key="1800000000")
    assert [(r.key, r.headers) for r in producer.records] == [
        (b"abc", [(KIND_HEADER, KIND_CANCEL)]),
        (b"1800000000", [(KIND_HEADER, KIND_CANCEL)]),
    ]
    decoded = Cancel()
    decoded.ParseFromString(producer.records[1].value)
    assert decoded.id == "seed-1-7"


def test_cancel_without_an_id_is_refused(client):
    with pytest.raises(ValueError, match="TimerHandle or a non-empty timer id"):
        client.cancel("")


def test_first_delivery_error_surfaces_on_the_next_call_then_clears(client, producer):
    producer.hold = True  # both reports arrive after both calls returned
    producer.fail_next = timed_out()
    lost = client.schedule("orders", "k", "v", delay=1)
    producer.fail_next = timed_out()
    client.schedule("orders", "k", "v", delay=1)
    producer.hold = False

    with pytest.raises(DeliveryError, match=f"timer {lost.id} was not delivered.*\\(and 1 more") as caught:
        client.schedule("orders", "k", "v", delay=1)
    assert isinstance(caught.value.__cause__, KafkaException)
    assert len(producer.records) == 2  # the call that reported the error sent nothing

    client.schedule("orders", "k", "v", delay=1)
    client.flush()
    assert len(producer.records) == 3


def test_delivery_error_surfaces_on_cancel(client, producer):
    producer.fail_next = timed_out()
    client.schedule("orders", "k", "v", delay=1)
    with pytest.raises(DeliveryError, match="Message timed out"):
        client.cancel("abc")


def test_flush_raises_for_a_failure_reported_during_flush(client, producer):
    producer.hold = True
    producer.fail_next = timed_out()
    handle = client.schedule("orders", "k", "v", delay=1)
    producer.hold = False
    with pytest.raises(DeliveryError, match=handle.id):
        client.flush(timeout=1)


def test_flush_raises_when_records_remain_undelivered(client, producer):
    producer.hold = True
    client.schedule("orders", "k", "v", delay=1)
    with pytest.raises(DeliveryError, match="1 record\\(s\\) still undelivered"):
        client.flush(timeout=0.1)


def test_context_manager_flushes_and_closed_client_refuses_use(producer):
    producer.hold = True
    producer.fail_next = timed_out()
    with pytest.raises(DeliveryError):  # reported by the closing flush, not lost
        with TimerClient(COMMON, producer=producer) as client:
            client.schedule("orders", "k", "v", delay=1)
            producer.hold = False
    with pytest.raises(TimersError, match="closed"):
        client.schedule("orders", "k", "v", delay=1)


def test_context_manager_keeps_the_original_error(producer, caplog):
    producer.hold = True
    producer.fail_next = timed_out()
    with pytest.raises(RuntimeError, match="boom"):
        with TimerClient(COMMON, producer=producer) as client:
            client.schedule("orders", "k", "v", delay=1)
            producer.hold = False
            raise RuntimeError("boom")
    assert "Message timed out" in caplog.text  # the delivery failure is still logged


def test_async_schedule_returns_only_after_the_ack(producer):
    async def scenario():
        async with AsyncTimerClient(COMMON, producer=producer, clock=lambda: NOW) as client:
            producer.hold = True
            task = asyncio.create_task(client.schedule("orders", "k", "v", delay=10, id="t1"))
            await asyncio.sleep(0.2)
            assert not task.done()  # queued, not acknowledged
            producer.hold = False
            handle = await asyncio.wait_for(task, 5)
            await client.cancel(handle)
            return handle

    handle = asyncio.run(scenario())
    assert handle.id == "t1" and handle.due_ms == 1_800_000_010_250
    assert [r.key for r in producer.records] == [b"t1", b"t1"]
    assert producer.records[1].headers == [(KIND_HEADER, KIND_CANCEL)]


def test_async_delivery_failure_raises_from_the_await(producer):
    async def scenario():
        async with AsyncTimerClient(COMMON, producer=producer) as client:
            producer.fail_next = timed_out()
            with pytest.raises(DeliveryError, match="timer t1 was not delivered"):
                await client.schedule("orders", "k", "v", delay=1, id="t1")
            # Raised to its caller, so not reported again.
            return await client.schedule("orders", "k", "v", delay=1, id="t2")

    assert asyncio.run(scenario()).id == "t2"


def test_async_flush_reports_failures_nobody_awaited(producer):
    async def scenario():
        client = AsyncTimerClient(COMMON, producer=producer)
        producer.hold = True
        producer.fail_next = timed_out()
        task = asyncio.create_task(client.schedule("orders", "k", "v", delay=1, id="t1"))
        await asyncio.sleep(0.1)
        task.cancel()  # the caller gave up waiting
        await asyncio.sleep(0)
        producer.hold = False
        with pytest.raises(DeliveryError, match="timer t1"):
            for _ in range(50):
                await asyncio.sleep(0.02)
                await client.flush(timeout=1)
        await client.close()

    asyncio.run(scenario())


def test_async_flush_times_out_while_unacknowledged(producer):
    async def scenario():
        client = AsyncTimerClient(COMMON, producer=producer)
        producer.hold = True
        task = asyncio.create_task(client.schedule("orders", "k", "v", delay=1))
        await asyncio.sleep(0.05)
        with pytest.raises(DeliveryError, match="1 record\\(s\\) still unacknowledged"):
            await client.flush(timeout=0.1)
        producer.hold = False
        await client.close(timeout=5)
        return await task

    assert asyncio.run(scenario()).callback_topic == "orders"


def test_client_modules_do_not_import_faust():
    code = (
        "import futures.client, futures.client.guard, futures.cli, sys; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'mode', 'aiokafka')); "
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
