"""A timer's request as the client lays it out, and the ids it draws."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import UTC, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futures.client.partitioner import crc32_partition
from futures.client.records import TimerSpec, build_batches, build_schedule
from futures.client.request_wire import batch_values, random_id
from ktimers.config import CommonConfig
from ktimers.wire import Future, FutureBatch, Header

COMMON = CommonConfig()
NOW = 1.8e9
DATA = st.one_of(st.text(), st.binary())
SECONDS = st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.floats(-1e13, 1e13))
#: Every argument schedule takes, valid or not, at and delay most often one of them.
DUE = st.one_of(
    st.fixed_dictionaries({"at": st.one_of(SECONDS, st.datetimes(timezones=st.just(UTC)))}),
    st.fixed_dictionaries({"delay": st.one_of(SECONDS, st.timedeltas(min_value=timedelta(0)))}),
    st.fixed_dictionaries({}, optional={"at": SECONDS, "delay": SECONDS}),
)
CALLBACK = st.fixed_dictionaries(
    {"topic": st.one_of(st.text(min_size=1), st.text()), "key": DATA, "payload": DATA},
    optional={
        "id": st.one_of(st.none(), st.text(max_size=40)),
        "token": st.one_of(st.none(), st.text()),
        "headers": st.one_of(st.none(), st.lists(st.tuples(st.text(), DATA), max_size=3)),
    },
)
RECURRENCE = st.fixed_dictionaries(
    {},
    optional={
        "every": st.one_of(st.none(), st.floats(0, 1e6), st.timedeltas(min_value=timedelta(0))),
        "cron": st.one_of(st.none(), st.sampled_from(["* * * * *", "0 9 * * 1-5", "bad"])),
        "tz": st.one_of(st.none(), st.sampled_from(["UTC", "Europe/Paris", "Nowhere/X"])),
        "max_count": st.one_of(st.none(), st.integers(-2, 10)),
        "until": st.one_of(st.none(), SECONDS),
    },
)
TIMER = st.tuples(DUE, CALLBACK).map(lambda parts: {**parts[0], **parts[1]})


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _reference(timer: dict, handle, recurrence=None) -> Future:
    """The timer's ``Future`` as protobuf builds it from the arguments, field by field."""
    future = Future(
        callBackTopic=timer["topic"],
        callBackKey=_text(timer["key"]),
        callBack=_bytes(timer["payload"]),
        id=handle.id,
        due_ms=handle.due_ms,
        token=timer.get("token") or "",
        headers=[Header(key=k, value=_bytes(v)) for k, v in timer.get("headers") or ()],
    )
    if recurrence is not None:
        future.recurrence.CopyFrom(recurrence)
    return future


@settings(max_examples=1000, deadline=None)
@given(timer=st.tuples(TIMER, RECURRENCE).map(lambda parts: {**parts[0], **parts[1]}))
def test_a_request_is_the_bytes_protobuf_writes(timer):
    """Any timer the client accepts is sent as the bytes protobuf writes for its ``Future`` (so the
    worker, or any other reader, parses it as the message it is); any other is refused with a
    ValueError that says why."""
    try:
        record, handle = build_schedule(COMMON, now=NOW, **timer)
    except ValueError:
        return
    parsed = Future.FromString(record.value)
    recurrence = parsed.recurrence if parsed.HasField("recurrence") else None
    assert record.value == _reference(timer, handle, recurrence).SerializeToString()
    assert record.key == handle.id.encode()
    assert handle.id == (timer.get("id") or handle.id) and len(handle.id) > 0


@settings(max_examples=150, deadline=None)
@given(timers=st.lists(TIMER, max_size=10), batch_size=st.integers(1, 5), max_bytes=st.integers(1, 400))
def test_a_batch_is_the_bytes_protobuf_writes(timers, batch_size, max_bytes):
    try:
        specs = [TimerSpec(**timer) for timer in timers]
        records, handles = build_batches(
            COMMON, specs, partitions=3, partition_of=crc32_partition, now=NOW,
            batch_size=batch_size, max_batch_bytes=max_bytes,
        )  # fmt: skip
    except ValueError:
        return
    sent = []
    for record in records:
        batch = FutureBatch.FromString(record.value)
        assert record.value == batch.SerializeToString()
        assert len(batch.futures) <= batch_size
        assert len(record.value) <= max_bytes or len(batch.futures) == 1
        sent += (future.SerializeToString() for future in batch.futures)
    expected = [
        _reference(timer, handle).SerializeToString() for timer, handle in zip(timers, handles, strict=True)
    ]
    assert sorted(sent) == sorted(expected)


SERIALIZED = st.builds(
    Future, callBackTopic=st.text(), callBack=st.binary(max_size=300), due_ms=st.integers(0, 2**40)
).map(Future.SerializeToString)


@given(
    futures=st.lists(SERIALIZED, max_size=30), max_count=st.integers(1, 40), max_bytes=st.integers(1, 2000)
)
def test_batches_hold_every_future_in_order_each_as_full_as_its_bounds_allow(futures, max_count, max_bytes):
    values = batch_values(futures, max_count, max_bytes)
    held = [list(FutureBatch.FromString(value).futures) for value in values]
    assert [future.SerializeToString() for batch in held for future in batch] == futures
    for i, (value, batch) in enumerate(zip(values, held, strict=True)):
        assert value == FutureBatch(futures=batch).SerializeToString()
        assert len(batch) <= max_count and (len(value) <= max_bytes or len(batch) == 1)
        if i + 1 < len(values):  # the next batch's first would not have fitted
            after = FutureBatch(futures=held[i + 1][:1]).SerializeToString()
            assert len(batch) == max_count or len(value) + len(after) > max_bytes


def test_a_due_time_of_zero_is_still_written():
    """``due_ms`` has presence: a request without it is read in the seed format, by its key."""
    record, _ = build_schedule(COMMON, "t", "k", b"", at=0, now=NOW)
    parsed = Future.FromString(record.value)
    assert parsed.HasField("due_ms") and parsed.due_ms == 0


@pytest.mark.parametrize("due", [{"at": 1e300}, {"at": -1e17}, {"delay": 1e17}, {"at": 9.3e15}])
def test_a_due_time_the_wire_cannot_hold_is_refused(due):
    with pytest.raises(ValueError, match="outside a 64-bit count of ms"):
        build_schedule(COMMON, "t", "k", b"", now=NOW, **due)


def test_ids_are_uuid4_hex_and_never_repeat():
    ids = [random_id() for _ in range(20_000)]  # many times the ids drawn from the OS at once
    assert len(set(ids)) == len(ids)
    for timer_id in ids[:600]:
        parsed = uuid.UUID(hex=timer_id)
        assert parsed.hex == timer_id and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_threads_drawing_ids_at_once_get_different_ones():
    drawn: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(len(drawn))

    def draw(into: list[str]) -> None:
        start.wait()
        into.extend(random_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [timer_id for into in drawn for timer_id in into]
    assert len(set(every)) == len(every) == 20_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_draws_ids_of_its_own():
    random_id()  # the parent holds random bytes not yet used
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's
        os.close(read_end)
        os.write(write_end, " ".join(random_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_ids = set(pipe.read().split())
    os.waitpid(child, 0)
    parent_ids = {random_id() for _ in range(100)}
    assert len(child_ids) == 100 and not child_ids & parent_ids
