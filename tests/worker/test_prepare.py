"""A callback read from a stored timer's bytes is what protobuf reads in them, whatever the bytes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

import futures.worker.prepare as prepare_module
from futures.client import request_wire
from futures.worker import (
    built_ahead,
    callback_queue,
    fired_columns,
    fired_keys,
    future_columns,
    staging,
    table_read,
    table_write,
)
from futures.worker.callback_queue import CallbackQueue
from futures.worker.callbacks import Callback
from futures.worker.kafka import Deliveries
from futures.worker.prepare import prepare
from futures.worker.table import table_key
from ktimers.wire import Future, Header, Recurrence, StoredTimer, callback_headers, ordinal_of
from tests.protobuf_bytes import varint

_FIRED = b"1700000000999"
_INT64 = st.integers(-(2**63), 2**63 - 1)

_futures = st.builds(
    Future,
    callBackTopic=st.text(max_size=20),
    callBackKey=st.text(max_size=20),
    callBack=st.binary(max_size=60),
    id=st.text(max_size=30),
    due_ms=_INT64,
    token=st.text(max_size=12),
    headers=st.lists(st.builds(Header, key=st.text(max_size=8), value=st.binary(max_size=8)), max_size=3),
    recurrence=st.one_of(st.none(), st.builds(Recurrence, interval_ms=st.integers(0, 10**6), ordinal=_INT64)),
)
_timers = st.builds(
    StoredTimer,
    future=_futures,
    source_partition=st.integers(-(2**31), 2**31 - 1),
    source_offset=_INT64,
    accepted_ms=_INT64,
    source_topic=st.text(max_size=10),
)


def _expected(key: bytes, partition: int, timer: StoredTimer) -> Callback:
    """The callback as protobuf's own reading of ``timer`` gives it."""
    future = timer.future
    headers = callback_headers(timer, _FIRED)
    own = tuple((name, value) for name, value in headers[: -3 - bool(future.token)])
    return Callback(
        key,
        partition,
        future.callBackTopic,
        future.callBackKey.encode(),
        future.callBack,
        future.id,
        future.due_ms,
        timer.source_offset,
        future.id.encode(),
        str(future.due_ms).encode(),
        own,
        future.token.encode(),
        ordinal_of(future.recurrence) if future.HasField("recurrence") else 0,
    )


@settings(max_examples=300)
@given(timer=_timers, partition=st.integers(0, 1023))
def test_a_callback_holds_what_protobuf_reads_in_the_stored_timer(timer: StoredTimer, partition: int) -> None:
    key = table_key(max(timer.future.due_ms, 0), timer.future.id)
    stored = timer.SerializeToString()
    callback = prepare(key, partition, stored)

    assert callback == _expected(key, partition, timer)
    # Queued as the callback record a timer's callback is: the user's headers, then ours.
    queued: list[tuple[object, ...]] = []
    deliveries = Deliveries()
    CallbackQueue(lambda *record: queued.append(record), _unused, lambda topic: None).put(
        callback, _FIRED, deliveries, 0, {}
    )
    future = timer.future
    [(topic, value, record_key, *_, headers)] = queued
    assert (topic, value, record_key) == (future.callBackTopic, future.callBack, future.callBackKey.encode())
    assert headers == callback_headers(timer, _FIRED)
    assert deliveries.pending == 1


def _unused(*args: object, **kwargs: object) -> None:
    raise AssertionError("the record was queued at once: no fallback")


@given(first=_timers, second=_timers)
def test_fields_given_twice_read_as_protobuf_merges_them(first: StoredTimer, second: StoredTimer) -> None:
    """Messages concatenated are merged: the last singular value wins, headers add up, the
    ``Future`` and its ``Recurrence`` merge field by field."""
    stored = first.SerializeToString() + second.SerializeToString()
    merged = StoredTimer.FromString(stored)

    assert prepare(b"k", 0, stored) == _expected(b"k", 0, merged)


@given(timer=_timers, unknown=st.lists(st.tuples(st.integers(9, 2000), st.binary(max_size=10)), max_size=4))
def test_unknown_fields_are_skipped(timer: StoredTimer, unknown: list[tuple[int, bytes]]) -> None:
    extra = b"".join(
        varint(number << 3 | 2) + varint(len(value)) + value for number, value in unknown
    )  # length-delimited fields no message of ours has
    stored = extra + timer.SerializeToString() + extra

    assert prepare(b"k", 0, stored) == _expected(b"k", 0, StoredTimer.FromString(stored))


@settings(max_examples=500)
@given(stored=st.binary(max_size=80))
@example(stored=b"\x0a\x05ab")  # a length past the end
@example(stored=b"\x00")  # field number 0
@example(stored=b"\x0b\x0c")  # a group
@example(stored=b"\x18" + b"\xff" * 10 + b"\x01")  # a varint of eleven bytes
@example(stored=b"\x0a\x04\x0a\x02\xc3\x28")  # a callback topic that is not UTF-8
@example(stored=b"\x0a\x04\x12\x02\xc3\x28")  # a callback key that is not UTF-8
@example(stored=b"\x2a\x01\x80\x08\x00")  # a source topic that is not UTF-8
@example(stored=b"\x0a\x05\x42\x03\x0a\x01\x80")  # a cron expression that is not UTF-8
@example(stored=b"\x0a\x05\x42\x03\x12\x01\x80")  # a time zone that is not UTF-8
def test_any_bytes_give_the_callback_protobuf_reads_or_a_decode_error(stored: bytes) -> None:
    try:
        callback = prepare(b"k", 0, stored)
    except DecodeError:
        return
    try:
        timer = StoredTimer.FromString(stored)
    except DecodeError:
        # protobuf reads some inputs that are never written (a group), and this reads nothing else.
        pytest.fail(f"read {stored!r}, which protobuf refuses")
    assert callback == _expected(b"k", 0, timer)


def test_a_value_that_is_not_bytes_is_refused() -> None:
    with pytest.raises(TypeError):
        prepare(b"k", 0, bytearray(b"\x0a\x00"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "module",
    [
        prepare_module,
        future_columns,
        staging,
        fired_keys,
        table_read,
        table_write,
        callback_queue,
        fired_columns,
        built_ahead,
        request_wire,
    ],
)
def test_the_compiled_modules_are_built_from_their_sources(module: ModuleType) -> None:
    """``make venv`` rebuilds them; run directly after editing a .pyx or the .pxd, pytest would
    test the old build."""
    built = Path(module.__file__ or "")
    assert built.suffix == ".so", f"{built} is not a compiled module"
    name = module.__name__.rpartition(".")[2]
    for source in (built.parent / f"{name}.pyx", REPO / "ktimers" / "protowire.pxd"):
        assert built.stat().st_mtime >= source.stat().st_mtime, (
            f"{built} is older than {source}: run make venv"
        )


REPO = Path(__file__).resolve().parents[2]
_SURROGATE, _OVERLONG, _PAST_UNICODE = b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"


@settings(max_examples=500)
@given(
    text=st.one_of(
        st.text(max_size=12).map(str.encode),
        st.binary(max_size=12),
        st.lists(
            st.sampled_from([b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", _SURROGATE, _OVERLONG,
                             _PAST_UNICODE, b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\x80", b"\xc3"]),
            max_size=4,
        ).map(b"".join),
    )
)  # fmt: skip
def test_a_topic_is_read_exactly_when_it_is_utf_8(text: bytes) -> None:
    future = b"\x0a" + bytes([len(text)]) + text
    stored = b"\x0a" + bytes([len(future)]) + future
    try:
        expected = text.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(DecodeError):
            prepare(b"k", 0, stored)
        return
    assert prepare(b"k", 0, stored).topic == expected


def test_what_is_not_utf_8_is_refused_as_protobuf_refuses_it() -> None:
    for field in (1, 2, 4, 6):  # callBackTopic, callBackKey, id, token
        future = bytes([field << 3 | 2, 2, 0xC3, 0x28])
        stored = b"\x0a" + bytes([len(future)]) + future
        with pytest.raises(DecodeError):
            StoredTimer.FromString(stored)
        with pytest.raises(DecodeError):
            prepare(b"k", 0, stored)
