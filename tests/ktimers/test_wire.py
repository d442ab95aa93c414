"""The wire format: generated code in sync with the schema, sortable keys, seed compatibility."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from ktimers import recurrence
from ktimers.wire import (
    H_OCCURRENCE,
    KIND_BATCH,
    KIND_HEADER,
    FiredTimers,
    Future,
    Header,
    Recurrence,
    ScheduledTimers,
    StoredTimer,
    TimerEvent,
    TimerEventBatch,
    callback_header_values,
    callback_headers,
    decode_events,
    due_prefix,
    encode_second_key,
    lay_out_callback_headers,
    occurrence_headers,
    parse_second_key,
    split_timer_key,
    timer_key,
)

REPO = Path(__file__).resolve().parents[2]

# Due times around the edges a wrong codec would trip on: byte boundaries, 2^32 ms
# (a 4-byte or native-int codec wraps there; today's epoch ms is already ~2^40.7),
# and the largest value the 8-byte key holds.
DUE_MS = [
    0,
    1,
    255,
    256,
    65_535,
    65_536,
    2**32 - 1,
    2**32,
    2**32 + 1,
    1_700_000_000_000,
    1_700_000_000_001,
    2**40,
    2**63 - 1,
    2**63,
    2**64 - 1,
]
IDS = ["", "0", "a", "aa", "ab", "b", "seed-0-17", "seed-0-2", "z" * 40, "é", "日本"]


def test_generated_code_matches_the_schema(tmp_path: Path) -> None:
    # The same command as `make proto`, run from the repository root so the
    # file name embedded in the descriptor is the same.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            "proto/timers.proto",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    for name in ("timers_pb2.py", "timers_pb2.pyi"):
        generated = (tmp_path / name).read_bytes()
        checked_in = (REPO / "ktimers" / name).read_bytes()
        assert generated == checked_in, (
            f"ktimers/{name} is out of date with proto/timers.proto: run make proto"
        )


def test_timer_keys_sort_by_due_time_then_id() -> None:
    pairs = [(due, timer_id) for due in DUE_MS for timer_id in IDS]
    shuffled = pairs[:]
    random.Random(7).shuffle(shuffled)

    by_key = sorted(shuffled, key=lambda pair: timer_key(*pair))

    assert by_key == sorted(pairs)


@pytest.mark.parametrize("due_ms", DUE_MS)
def test_split_timer_key_inverts_timer_key(due_ms: int) -> None:
    for timer_id in IDS:
        assert split_timer_key(timer_key(due_ms, timer_id)) == (due_ms, timer_id)


def test_due_prefix_separates_earlier_from_later_timers() -> None:
    # A "due by" scan reads from the start of the table up to due_prefix(limit).
    limit = 2**32 + 1000
    for due in DUE_MS:
        for timer_id in IDS:
            key = timer_key(due, timer_id)
            assert (key < due_prefix(limit)) == (due < limit), (due, timer_id)


@pytest.mark.parametrize(
    ("key", "second"),
    [(b"0", 0), (b"7", 7), (b"1700000000", 1_700_000_000), (b"999999999999", 999_999_999_999)],
)
def test_parse_second_key_reads_decimal_seconds(key: bytes, second: int) -> None:
    assert parse_second_key(key) == second


@pytest.mark.parametrize(
    "key",
    [
        None,
        b"",
        b"-1",
        b"+1",
        b"1.5",
        b" 17",
        b"17 ",
        b"17a",
        b"0x11",
        "٣".encode(),  # an Arabic-Indic digit: a digit to str.isdigit, not to us
        b"1" * 13,  # longer than any epoch second we accept
        b"99999999999999999999999",
    ],
)
def test_parse_second_key_rejects_anything_else(key: bytes | None) -> None:
    assert parse_second_key(key) is None


def test_second_keys_round_trip() -> None:
    for second in (0, 59, 1_700_000_000, 999_999_999_999):
        assert parse_second_key(encode_second_key(second)) == second


def test_seed_future_fields_keep_their_numbers() -> None:
    fields = Future.DESCRIPTOR.fields_by_name
    assert fields["callBackTopic"].number == 1
    assert fields["callBackKey"].number == 2
    assert fields["callBack"].number == 3


def test_seed_future_round_trips_and_reads_the_original_bytes() -> None:
    payload = bytes(range(256))
    seed = Future(callBackTopic="orders", callBackKey="order-42", callBack=payload)

    decoded = Future.FromString(seed.SerializeToString())

    assert (decoded.callBackTopic, decoded.callBackKey, decoded.callBack) == ("orders", "order-42", payload)
    assert not decoded.HasField("due_ms") and decoded.id == ""
    # What a producer of the original design writes: fields 1-3, length-delimited.
    original = b"\x0a\x06orders" + b"\x12\x08order-42" + b"\x1a\x80\x02" + payload
    assert Future.FromString(original) == seed


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(st.none(), st.binary(max_size=300)),
    kind=st.one_of(st.none(), st.just(KIND_BATCH), st.binary(max_size=8)),
)
def test_decode_events_gives_events_or_a_decode_error_for_any_record(
    value: bytes | None, kind: bytes | None
) -> None:
    headers = [] if kind is None else [(KIND_HEADER, kind)]
    try:
        events = decode_events(value, headers)
    except DecodeError:
        return
    assert all(isinstance(e, TimerEvent) for e in events)


def test_decode_events_reads_a_batch_and_a_single_event_alike() -> None:
    one = TimerEvent(id="a", kind=TimerEvent.FIRED, partition=2)
    two = TimerEvent(id="b", kind=TimerEvent.SCHEDULED, partition=2)
    batch = TimerEventBatch(events=[one, two]).SerializeToString()
    assert decode_events(batch, [(KIND_HEADER, KIND_BATCH)]) == [one, two]
    assert decode_events(one.SerializeToString(), None) == [one]


def test_decode_events_gives_fired_columns_as_fired_events_after_the_others() -> None:
    cancelled = TimerEvent(id="c", kind=TimerEvent.CANCELLED, partition=3)
    block = FiredTimers(id=["a", "b"], due_ms=[10, 20], source_offset=[5, 6], at_ms=30, partition=3)
    value = TimerEventBatch(events=[cancelled], fired=[block]).SerializeToString()
    fired = [
        TimerEvent(id="a", kind=TimerEvent.FIRED, due_ms=10, at_ms=30, partition=3, source_offset=5),
        TimerEvent(id="b", kind=TimerEvent.FIRED, due_ms=20, at_ms=30, partition=3, source_offset=6),
    ]
    assert decode_events(value, [(KIND_HEADER, KIND_BATCH)]) == [cancelled, *fired]


def test_decode_events_gives_scheduled_columns_in_their_place_among_the_other_events() -> None:
    # Scheduled a and b, cancelled b, scheduled b again, then c fired: as a step would write it.
    cancelled = TimerEvent(id="b", kind=TimerEvent.CANCELLED, partition=3, due_ms=20)
    first = ScheduledTimers(
        id=["a", "b"], due_ms=[10, 20], source_offset=[5, 6], callback_topic=["x", "y"], at_ms=30, partition=3
    )
    again = ScheduledTimers(
        id=["b"], due_ms=[40], source_offset=[7], callback_topic=["y"], at_ms=30, partition=3
    )
    again.at_event = 1
    fired = FiredTimers(id=["c"], due_ms=[1], source_offset=[2], at_ms=31, partition=3)
    value = TimerEventBatch(events=[cancelled], scheduled=[first, again], fired=[fired]).SerializeToString()

    def scheduled(timer_id: str, due_ms: int, offset: int, topic: str) -> TimerEvent:
        return TimerEvent(
            id=timer_id,
            kind=TimerEvent.SCHEDULED,
            due_ms=due_ms,
            at_ms=30,
            partition=3,
            source_offset=offset,
            callback_topic=topic,
        )

    assert decode_events(value, [(KIND_HEADER, KIND_BATCH)]) == [
        scheduled("a", 10, 5, "x"),
        scheduled("b", 20, 6, "y"),
        cancelled,
        scheduled("b", 40, 7, "y"),
        TimerEvent(id="c", kind=TimerEvent.FIRED, due_ms=1, at_ms=31, partition=3, source_offset=2),
    ]


@settings(max_examples=300)
@given(
    places=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
    events=st.integers(0, 4),
)
def test_scheduled_blocks_at_any_place_come_out_once_each_in_a_stable_order(
    places: list[int], events: int
) -> None:
    batch = TimerEventBatch(
        events=[TimerEvent(id=f"e{n}", kind=TimerEvent.CANCELLED) for n in range(events)],
        scheduled=[
            ScheduledTimers(id=[f"s{n}"], due_ms=[0], source_offset=[0], callback_topic=[""], at_event=place)
            for n, place in enumerate(places)
        ],
    )
    order = [e.id for e in decode_events(batch.SerializeToString(), [(KIND_HEADER, KIND_BATCH)])]
    assert sorted(order) == sorted([f"e{n}" for n in range(events)] + [f"s{n}" for n in range(len(places))])
    # Each block stands just before the event at its place (clamped to the batch), in block order.
    where = {f"s{n}": min(max(place, 0), events) for n, place in enumerate(places)}
    expected = sorted(where, key=lambda name: (where[name], int(name[1:])))
    assert [name for name in order if name.startswith("s")] == expected
    for name, place in where.items():
        assert order.index(name) == place + sorted(where.values()).index(place) + [
            other for other in expected if where[other] == place
        ].index(name)


@settings(max_examples=300)
@given(
    ids=st.lists(st.text(max_size=20), max_size=5),
    due=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    offsets=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    topics=st.lists(st.text(max_size=20), max_size=5),
)
def test_scheduled_columns_of_any_length_give_events_or_a_decode_error(
    ids: list[str], due: list[int], offsets: list[int], topics: list[str]
) -> None:
    block = ScheduledTimers(id=ids, due_ms=due, source_offset=offsets, callback_topic=topics)
    value = TimerEventBatch(scheduled=[block]).SerializeToString()
    try:
        events = decode_events(value, [(KIND_HEADER, KIND_BATCH)])
    except DecodeError as exc:
        assert not len(ids) == len(due) == len(offsets) == len(topics)
        assert "differ in length" in str(exc)
        return
    assert [(e.id, e.due_ms, e.source_offset, e.callback_topic) for e in events] == list(
        zip(ids, due, offsets, topics, strict=True)
    )
    assert all(e.kind == TimerEvent.SCHEDULED for e in events)


@settings(max_examples=300)
@given(
    ids=st.lists(st.text(max_size=20), max_size=5),
    due=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    offsets=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
)
def test_fired_columns_of_any_length_give_events_or_a_decode_error(
    ids: list[str], due: list[int], offsets: list[int]
) -> None:
    block = FiredTimers(id=ids, due_ms=due, source_offset=offsets)
    value = TimerEventBatch(fired=[block]).SerializeToString()
    try:
        events = decode_events(value, [(KIND_HEADER, KIND_BATCH)])
    except DecodeError as exc:
        assert not len(ids) == len(due) == len(offsets)
        assert "differ in length" in str(exc)
        return
    assert [(e.id, e.due_ms, e.source_offset) for e in events] == list(zip(ids, due, offsets, strict=True))


def test_callback_headers_carry_kt_occurrence_where_the_worker_puts_it() -> None:
    """The jobs' builder and the worker's (values, then the ordinal, then the layout) agree."""
    assert (recurrence.H_OCCURRENCE, recurrence.occurrence_headers) == (H_OCCURRENCE, occurrence_headers)
    one_shot = Future(id="t", due_ms=5_000, headers=[Header(key="tenant", value=b"a")], token="tok")
    series = Future(id="s", due_ms=65_000, recurrence=Recurrence(interval_ms=60_000, ordinal=2))
    first = Future(id="f", due_ms=5_000, recurrence=Recurrence(cron="@hourly"))  # ordinal 0 means 1
    fired = b"70000"
    for future, expected in (
        (one_shot, [("tenant", b"a"), ("kt-id", b"t"), ("kt-due-ms", b"5000"), ("kt-token", b"tok"),
                    ("kt-fired-ms", fired)]),
        (series, [(H_OCCURRENCE, b"2"), ("kt-id", b"s"), ("kt-due-ms", b"65000"), ("kt-fired-ms", fired)]),
        (first, [(H_OCCURRENCE, b"1"), ("kt-id", b"f"), ("kt-due-ms", b"5000"), ("kt-fired-ms", fired)]),
    ):  # fmt: skip
        timer = StoredTimer(future=future)
        own, timer_id, due, token = callback_header_values(timer)
        _, own = occurrence_headers(timer, own)
        assert callback_headers(timer, fired) == lay_out_callback_headers(own, timer_id, due, token, fired)
        assert callback_headers(timer, fired) == expected
