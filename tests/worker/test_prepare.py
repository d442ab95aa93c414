"""A callback read from a stored timer's bytes is what protobuf reads in them, whatever the bytes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

import futures.worker.prepare as prepare_module
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
from tests.protobuf_bytes import field_numbers, nested_groups, tag, unknown_fields, varint, wire_soup

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


# Fields no message of ours has, of every wire type (groups nested, varints of ten bytes).
_unknown = unknown_fields(st.integers(9, 2**29 - 1))


def _len_field(number: int, value: bytes) -> bytes:
    return tag(number, 2) + varint(len(value)) + value


@settings(max_examples=300)
@given(timer=_timers, unknown=st.lists(_unknown, min_size=8, max_size=8))
@example(timer=StoredTimer(), unknown=[b"\x7b\x7c"] * 8)  # field 15 as an empty group
@example(timer=StoredTimer(), unknown=[b"\x78" + b"\xff" * 9 + b"\x7f"] * 8)  # a varint of ten bytes
def test_unknown_fields_of_every_wire_type_are_skipped_at_every_level(
    timer: StoredTimer, unknown: list[bytes]
) -> None:
    """Protobuf keeps unknown fields (an ingest stores them with the timer): the timer's
    callback is what protobuf reads, wherever they are."""
    future, header, recurrence = timer.future, Header(key="h", value=b"v"), timer.future.recurrence
    header_bytes = unknown[0] + header.SerializeToString() + unknown[1]
    recurrence_bytes = recurrence.SerializeToString() + unknown[2]
    future_bytes = (
        unknown[3]
        + future.SerializeToString()
        + _len_field(7, header_bytes)
        + (_len_field(8, recurrence_bytes) if future.HasField("recurrence") else b"")
        + unknown[4]
    )
    rest = StoredTimer(
        source_partition=timer.source_partition,
        source_offset=timer.source_offset,
        accepted_ms=timer.accepted_ms,
        source_topic=timer.source_topic,
    ).SerializeToString()
    stored = unknown[5] + _len_field(1, future_bytes) + unknown[6] + rest + unknown[7]

    assert prepare(b"k", 0, stored) == _expected(b"k", 0, StoredTimer.FromString(stored))


def _protobuf_reads(stored: bytes) -> StoredTimer | None:
    try:
        return StoredTimer.FromString(stored)
    except DecodeError:
        return None


def _prepared(stored: bytes) -> Callback | None:
    try:
        return prepare(b"k", 0, stored)
    except DecodeError:
        return None


def _assert_read_as_protobuf_reads(stored: bytes) -> None:
    """Read exactly when protobuf reads ``stored``, and then as protobuf reads it."""
    timer, callback = _protobuf_reads(stored), _prepared(stored)
    assert (callback is None) == (timer is None), f"protobuf {'reads' if timer else 'refuses'} {stored!r}"
    if timer is not None:
        assert callback == _expected(b"k", 0, timer)


_GROUPS_AT_THE_LIMIT = nested_groups(100)  # protobuf reads 100 levels below the message, no more


@settings(max_examples=500)
@given(stored=st.binary(max_size=80))
@example(stored=b"\x0a\x05ab")  # a length past the end
@example(stored=b"\x00")  # field number 0
@example(stored=b"\x0b\x0c")  # a group, in the place of the Future
@example(stored=b"\x7b\x7c")  # an unknown group
@example(stored=b"\x7b\x84\x01")  # a group closed by another field's end-group
@example(stored=b"\x7c")  # an end-group that closes no group
@example(stored=b"\x7b")  # a group never closed
@example(stored=b"\x0a\x01\x7b\x7c")  # a group running past the end of its message
@example(stored=b"\x18" + b"\xff" * 10 + b"\x01")  # a varint of eleven bytes
@example(stored=b"\x18" + b"\x80" * 9 + b"\x7f")  # a varint of ten bytes, bits past the 64th
@example(stored=b"\x98\x80\x80\x80\x00\x01")  # a tag of five bytes
@example(stored=b"\x98\x80\x80\x80\x80\x00\x01")  # a tag of six
@example(stored=b"\xf8\xff\xff\xff\x1f\x01")  # a tag past 32 bits
@example(stored=b"\x2a\x80\x80\x80\x80\x00")  # a length of six bytes
@example(stored=b"\x7e\x00")  # wire type 6
@example(stored=b"\x7f\x00")  # wire type 7
@example(stored=_GROUPS_AT_THE_LIMIT)
@example(stored=nested_groups(101))
@example(stored=_len_field(1, nested_groups(99)))  # the Future is a level down
@example(stored=_len_field(1, nested_groups(100)))
@example(stored=_len_field(1, _len_field(7, nested_groups(98))))  # a header two levels down
@example(stored=_len_field(1, _len_field(7, nested_groups(99))))
@example(stored=_len_field(1, _len_field(8, nested_groups(98))))  # a recurrence two levels down
@example(stored=_len_field(1, _len_field(8, nested_groups(99))))
@example(stored=b"\x0a\x04\x0a\x02\xc3\x28")  # a callback topic that is not UTF-8
@example(stored=b"\x0a\x04\x12\x02\xc3\x28")  # a callback key that is not UTF-8
@example(stored=b"\x2a\x01\x80\x08\x00")  # a source topic that is not UTF-8
@example(stored=b"\x0a\x05\x42\x03\x0a\x01\x80")  # a cron expression that is not UTF-8
@example(stored=b"\x0a\x05\x42\x03\x12\x01\x80")  # a time zone that is not UTF-8
def test_any_bytes_are_read_exactly_when_protobuf_reads_them(stored: bytes) -> None:
    _assert_read_as_protobuf_reads(stored)


@settings(max_examples=600)
@given(outer=wire_soup(), future=wire_soup(), inner=wire_soup(), where=st.sampled_from([7, 8]))
def test_bytes_near_the_wire_formats_rules_are_read_exactly_when_protobuf_reads_them(
    outer: bytes, future: bytes, inner: bytes, where: int
) -> None:
    """Arbitrary bytes rarely make a group or a ten-byte varint: these are made of them, at
    each level of a stored timer (its Future, a header or its recurrence)."""
    _assert_read_as_protobuf_reads(outer)
    _assert_read_as_protobuf_reads(_len_field(1, future + _len_field(where, inner)) + outer)


@given(fields=unknown_fields(field_numbers))
def test_fields_of_our_numbers_with_any_wire_type_are_read_as_protobuf_reads_them(fields: bytes) -> None:
    _assert_read_as_protobuf_reads(_len_field(1, fields))
    _assert_read_as_protobuf_reads(fields)


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
