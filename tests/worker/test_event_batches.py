"""`timer-events` as the engine writes it: one ``TimerEventBatch`` record per partition and step,
keyed by the partition, every event of a timer in order, each record within the producer's limit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from futures.worker.dispatch import _split
from ktimers.wire import (
    KIND_BATCH,
    KIND_HEADER,
    MAX_ID_BYTES,
    FiredTimers,
    ScheduledTimers,
    TimerEvent,
    TimerEventBatch,
    decode_events,
    event_batch_key,
)
from tests.worker.rig import T_MS, Kind, MakeRig, T


def test_a_step_writes_one_batch_record_per_partition_keyed_by_the_partition(make_rig: MakeRig) -> None:
    rig = make_rig()
    rig.ingest(
        rig.request("a", T_MS + 10, partition=0),
        rig.request("b", T_MS + 20, partition=0),
        rig.request("c", T_MS + 30, partition=2),
        rig.cancel("b", partition=0),
    )
    records = rig.producer.on(rig.topics.events)
    assert [(r.key, r.header(KIND_HEADER)) for r in records] == [
        (event_batch_key(0), KIND_BATCH),
        (event_batch_key(2), KIND_BATCH),
    ]
    # In the order things happened, within the partition's record.
    zero = decode_events(records[0].value, records[0].headers)
    assert [(e.id, e.kind) for e in zero] == [
        ("a", Kind.SCHEDULED),
        ("b", Kind.SCHEDULED),
        ("b", Kind.CANCELLED),
    ]

    rig.tick(T + 1, partitions=(0, 2))
    fired = rig.producer.on(rig.topics.events)[2:]
    assert sorted(r.key for r in fired) == [event_batch_key(0), event_batch_key(2)]
    assert sorted(e.id for r in fired for e in decode_events(r.value, r.headers)) == ["a", "c"]
    # A timer's events, read back in record order, are its history.
    assert [e.kind for e in rig.events() if e.id == "a"] == [Kind.SCHEDULED, Kind.FIRED]


def test_a_steps_schedules_and_cancels_come_out_in_the_order_they_happened(make_rig: MakeRig) -> None:
    rig = make_rig()
    rig.ingest(
        rig.request("a", T_MS + 10),
        rig.request("b", T_MS + 20),
        rig.cancel("b"),
        rig.request("b", T_MS + 30),
        rig.request("c", T_MS + 40, topic="invoices"),
        rig.cancel("nobody"),
    )
    (record,) = rig.producer.on(rig.topics.events)
    # The SCHEDULED events went in columns, the others one by one.
    batch = TimerEventBatch.FromString(record.value or b"")
    assert [e.kind for e in batch.events] == [Kind.CANCELLED, Kind.CANCEL_MISSED]
    assert [list(block.id) for block in batch.scheduled] == [["a", "b"], ["b", "c"]]
    events = decode_events(record.value, record.headers)
    assert [(e.id, e.kind, e.due_ms) for e in events] == [
        ("a", Kind.SCHEDULED, T_MS + 10),
        ("b", Kind.SCHEDULED, T_MS + 20),
        ("b", Kind.CANCELLED, T_MS + 20),
        ("b", Kind.SCHEDULED, T_MS + 30),
        ("c", Kind.SCHEDULED, T_MS + 40),
        ("nobody", Kind.CANCEL_MISSED, 0),
    ]
    scheduled = [e for e in events if e.kind == Kind.SCHEDULED]
    assert [e.callback_topic for e in scheduled] == ["orders", "orders", "orders", "invoices"]
    assert [e.source_offset for e in scheduled] == [0, 1, 3, 4]
    assert all(e.partition == 0 and e.at_ms == rig.now for e in events)


def test_a_step_with_more_events_than_a_record_holds_writes_several_each_within_the_limit(
    make_rig: MakeRig,
) -> None:
    # A small producer limit (TIMERS_MAX_PAYLOAD_BYTES plus the allowance: 18 KB) and long ids.
    rig = make_rig(max_payload_bytes=2000)
    long = "x" * (MAX_ID_BYTES - 8)
    ids = [f"{long}{n:08d}" for n in range(300)]
    rig.ingest(*(rig.request(timer_id, T_MS + n, key="k", payload=b"") for n, timer_id in enumerate(ids)))
    records = rig.producer.on(rig.topics.events)
    assert len(records) > 1
    assert all(len(r.value or b"") <= rig.config.max_record_bytes // 2 for r in records)
    assert [e.id for e in rig.events(Kind.SCHEDULED)] == ids


def test_a_hot_second_writes_its_fired_events_in_columns_each_record_within_the_limit(
    make_rig: MakeRig,
) -> None:
    rig = make_rig(max_payload_bytes=2000, fire_chunk_size=500)
    long = "x" * (MAX_ID_BYTES - 8)
    due = {f"{long}{n:08d}": T_MS - 1000 + (n * 7) % 1000 for n in range(300)}
    first = rig.last_offset(rig.topics.request, 0) + 1
    rig.ingest(*(rig.request(timer_id, ms, key="k", payload=b"") for timer_id, ms in due.items()))
    offset = {timer_id: first + n for n, timer_id in enumerate(due)}
    before = len(rig.producer.on(rig.topics.events))

    rig.tick(T)
    records = rig.producer.on(rig.topics.events)[before:]
    assert len(records) > 1
    assert all(len(r.value or b"") <= rig.config.max_record_bytes // 2 for r in records)
    assert all(TimerEventBatch.FromString(r.value or b"").fired for r in records)
    fired = [e for r in records for e in decode_events(r.value, r.headers)]
    assert [e.id for e in fired] == rig.fired()  # in the order the callbacks went out
    assert sorted(e.id for e in fired) == sorted(due)
    assert all(e.kind == Kind.FIRED and e.partition == 0 and e.at_ms == rig.now for e in fired)
    assert all(e.due_ms == due[e.id] and e.source_offset == offset[e.id] for e in fired)


_events = st.lists(
    st.builds(
        TimerEvent,
        id=st.text(max_size=MAX_ID_BYTES // 4),
        kind=st.sampled_from([Kind.SCHEDULED, Kind.FIRED, Kind.REJECTED]),
        due_ms=st.integers(0, 2**62),
        source_offset=st.integers(-1, 2**62),
        reason=st.text(max_size=400),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(events=_events, max_bytes=st.integers(4096, 20_000))
def test_splitting_keeps_every_event_in_order_and_each_part_within_the_limit(
    events: list[TimerEvent], max_bytes: int
) -> None:
    parts = _split(TimerEventBatch(events=events), max_bytes)
    assert all(len(part) <= max_bytes for part in parts)
    decoded = [e for part in parts for e in TimerEventBatch.FromString(part).events]
    assert decoded == events


_fired_blocks = st.lists(
    st.integers(0, 40).flatmap(
        lambda n: st.builds(
            FiredTimers,
            id=st.lists(st.text(max_size=MAX_ID_BYTES // 4), min_size=n, max_size=n),
            due_ms=st.lists(st.integers(0, 2**62), min_size=n, max_size=n),
            source_offset=st.lists(st.integers(-1, 2**62), min_size=n, max_size=n),
            at_ms=st.integers(0, 2**62),
            partition=st.integers(0, 1000),
        )
    ),
    max_size=4,
)


_scheduled_blocks = st.lists(
    st.integers(0, 40).flatmap(
        lambda n: st.builds(
            ScheduledTimers,
            id=st.lists(st.text(max_size=MAX_ID_BYTES // 4), min_size=n, max_size=n),
            due_ms=st.lists(st.integers(0, 2**62), min_size=n, max_size=n),
            source_offset=st.lists(st.integers(-1, 2**62), min_size=n, max_size=n),
            callback_topic=st.lists(st.text(max_size=249), min_size=n, max_size=n),
            at_ms=st.integers(0, 2**62),
            partition=st.integers(0, 1000),
            at_event=st.integers(0, 60),
        )
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(events=_events, scheduled=_scheduled_blocks, fired=_fired_blocks, max_bytes=st.integers(4096, 20_000))
def test_splitting_events_and_columns_of_both_kinds_keeps_every_event_in_order_within_the_limit(
    events: list[TimerEvent], scheduled: list[ScheduledTimers], fired: list[FiredTimers], max_bytes: int
) -> None:
    whole = TimerEventBatch(events=events, scheduled=scheduled, fired=fired)
    parts = _split(whole, max_bytes)
    assert all(len(part) <= max_bytes for part in parts)
    headers = [(KIND_HEADER, KIND_BATCH)]
    decoded = [e for part in parts for e in decode_events(part, headers)]
    assert decoded == decode_events(whole.SerializeToString(), headers)
    assert len(decoded) == len(events) + sum(len(block.id) for block in [*scheduled, *fired])


@settings(max_examples=200, deadline=None)
@given(events=_events, fired=_fired_blocks, max_bytes=st.integers(4096, 20_000))
def test_splitting_events_and_fired_columns_keeps_every_event_in_order_and_each_part_within_the_limit(
    events: list[TimerEvent], fired: list[FiredTimers], max_bytes: int
) -> None:
    whole = TimerEventBatch(events=events, fired=fired)
    parts = _split(whole, max_bytes)
    assert all(len(part) <= max_bytes for part in parts)
    headers = [(KIND_HEADER, KIND_BATCH)]
    decoded = [e for part in parts for e in decode_events(part, headers)]
    assert decoded == decode_events(whole.SerializeToString(), headers)
    assert len(decoded) == len(events) + sum(len(block.id) for block in fired)
