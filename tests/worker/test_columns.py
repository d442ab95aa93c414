"""Native records decoded into columns agree with the general parser, or defer to it.

:func:`futures.worker.columns.decode` either gives, for a record, exactly the timers
:func:`futures.ingress.requests.parse_record` schedules — same ids, due times,
callback topics, and stored bytes that read back as the same ``StoredTimer`` — or None,
and never raises.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import MonkeyPatch

from futures.ingress.base import MAX_DUE_MS
from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import RequestParser, Schedule
from futures.worker.columns import Decoder, Timers, decode
from ktimers.config import TopicsConfig
from ktimers.wire import (
    IDS_HEADER,
    IDS_NEW,
    KIND_BATCH,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    MAX_ID_BYTES,
    Cancel,
    Future,
    FutureBatch,
    Header,
    Recurrence,
    StoredTimer,
)
from tests.protobuf_bytes import nested_groups, unknown_fields, varint, wire_soup

NOW_MS = 1_795_000_000_000
TOPICS = TopicsConfig()
WORKER = ParseLimits(topics=TOPICS, allowed_callback_topics=("orders", "cb-*"), max_payload_bytes=600)
CONFIGS = [WORKER, replace(WORKER, max_due_ahead_s=3600.0), ParseLimits.permissive(TOPICS)]

# Mostly valid timers, so that most records are decoded; the rest test the deferral.
ids = st.one_of(
    st.text(min_size=1, max_size=12),
    st.text(min_size=1, max_size=12),
    st.just(""),
    st.text(min_size=1, max_size=12),
    st.just("é" * (MAX_ID_BYTES // 2)),  # exactly the limit, in bytes
    st.just("é" * (MAX_ID_BYTES // 2) + "x"),  # one byte over
)
dues = st.one_of(
    st.integers(min_value=NOW_MS - 10, max_value=NOW_MS + 7_200_000),
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=NOW_MS - 10, max_value=NOW_MS + 7_200_000),
    st.sampled_from([0, MAX_DUE_MS, MAX_DUE_MS + 1, -1]),
)
topics = st.sampled_from(["orders", "cb-x"] * 6 + ["", "not a topic!", "elsewhere", TOPICS.request])
# Around the payload limit, and past the two-byte length of a stored Future.
payloads = st.one_of(st.binary(max_size=8), st.sampled_from([100, 200, 400, 20_000]).map(lambda n: b"p" * n))


@st.composite
def futures(draw: st.DrawFn) -> Future:
    if draw(st.integers(0, 9)) < 8:  # a valid timer, or a small one that may be valid
        future = Future(
            id=draw(st.text(max_size=8)), callBackTopic="orders", callBack=draw(st.binary(max_size=8))
        )
        future.due_ms = draw(st.integers(min_value=NOW_MS, max_value=NOW_MS + 60_000))
        return future
    future = Future(
        id=draw(ids),
        callBackTopic=draw(topics),
        callBackKey=draw(st.text(max_size=4)),
        callBack=draw(payloads),
        token=draw(st.sampled_from(["", "tok"])),
        headers=[Header(key="h", value=b"v")] * draw(st.integers(0, 2)),
    )
    due = draw(dues)
    if due is not None:
        future.due_ms = due
    return future


# Fields no message of ours has, of every wire type (groups nested, varints of ten bytes), as
# clients of newer schemas, or of other languages, send.
unknown = unknown_fields(st.integers(9, 2**29 - 1), max_size=2)
# A Future's bytes as a client other than ours may write them: merged from two, among unknown fields.
noisy = st.tuples(
    unknown, futures(), st.one_of(st.just(b""), futures().map(Future.SerializeToString)), unknown
).map(lambda parts: parts[0] + parts[1].SerializeToString() + parts[2] + parts[3])
singles = st.one_of(futures().map(lambda f: f.SerializeToString()), noisy)
batches = st.one_of(
    st.lists(futures(), max_size=4).map(lambda fs: FutureBatch(futures=fs).SerializeToString()),
    st.tuples(st.lists(noisy, max_size=3), unknown).map(
        lambda parts: b"".join(b"\n" + varint(len(f)) + f for f in parts[0]) + parts[1]
    ),
)
# (kt-kind headers, value): mostly what clients send, then anything.
sent = st.one_of(
    st.tuples(st.sampled_from([(), (KIND_FUTURE,)]), singles),
    st.tuples(st.just((KIND_BATCH,)), batches),
    st.tuples(
        st.lists(st.sampled_from([None, KIND_FUTURE, KIND_CANCEL, KIND_BATCH, b"frobnicate"]), max_size=2),
        st.one_of(
            singles,
            batches,
            ids.map(lambda i: Cancel(id=i).SerializeToString()),
            st.binary(max_size=16),
            wire_soup(),
            st.just(b"\x00\x00\x00\x00\x01\x00"),  # Schema Registry framing
            st.none(),
        ),
    ),
)


# A request record's ``kt-ids`` header: absent, what the client sends, or a value that says nothing.
ids_headers = st.sampled_from([None, IDS_NEW, b"old", None])


def _headers(kinds: list[bytes | None], ids_header: bytes | None) -> tuple[tuple[str, bytes | None], ...]:
    headers = tuple((KIND_HEADER, kind) for kind in kinds)
    return headers if ids_header is None else ((IDS_HEADER, ids_header), *headers)


@settings(max_examples=800, deadline=None)
@given(
    sent=sent,
    ids_header=ids_headers,
    key=st.sampled_from([None, b"1795000000"]),
    offset=st.sampled_from([0, 1, 77, 127, 128, 16_383, 16_384, 2**40, 2**63 - 1]),
    config=st.sampled_from(CONFIGS),
)
def test_columns_hold_what_the_parser_schedules(
    sent: tuple[list[bytes | None], bytes | None],
    ids_header: bytes | None,
    key: bytes | None,
    offset: int,
    config: ParseLimits,
) -> None:
    kinds, value = sent
    record = SourceRecord(TOPICS.request, 2, offset, key, value, _headers(kinds, ids_header), NOW_MS)
    parser = RequestParser(config, NOW_MS)
    timers = decode(record, parser.context)
    if timers is None:
        return
    assert timers.new_ids == (ids_header == IDS_NEW)
    requests = parser.parse(record)
    assert all(isinstance(r, Schedule) for r in requests)
    schedules = [r for r in requests if isinstance(r, Schedule)]
    assert timers.ids == [s.timer_id for s in schedules]
    assert timers.id_bytes == [s.timer_id.encode() for s in schedules]
    assert timers.due_ms == [s.due_ms for s in schedules]
    assert timers.callback_topics == [s.timer.future.callBackTopic for s in schedules]
    # The record's own Future bytes (a derived id appended as a field): what they read back as.
    assert [StoredTimer.FromString(stored) for stored in timers.stored] == [s.timer for s in schedules]
    # Never smaller than the parser's: the payload limit refuses no less here.
    assert all(len(mine) >= s.timer.ByteSize() for mine, s in zip(timers.stored, schedules, strict=True))


@settings(max_examples=400, deadline=None)
@given(
    sent=st.lists(st.tuples(sent, ids_headers), min_size=1, max_size=8),
    first_offset=st.sampled_from([0, 1, 127, 2**40]),
    max_timers=st.integers(1, 12),
    config=st.sampled_from(CONFIGS),
)
def test_a_run_of_records_decodes_as_each_record_alone_up_to_the_first_it_leaves_to_the_parser(
    sent: list[tuple[tuple[list[bytes | None], bytes | None], bytes | None]],
    first_offset: int,
    max_timers: int,
    config: ParseLimits,
) -> None:
    # A producer sending one Future per record: the worker decodes the records of a partition
    # together, and must take exactly what it takes of each alone; a run's records all say
    # their ids are new (kt-ids: new), or none does.
    records = [
        SourceRecord(TOPICS.request, 2, first_offset + i, None, value, _headers(kinds, ids_header), NOW_MS)
        for i, ((kinds, value), ids_header) in enumerate(sent)
    ]
    decoder = Decoder(RequestParser(config, NOW_MS).context)
    timers, taken = decoder.decode_run(records, max_timers)
    alone: list[Timers] = []
    for record in records:
        if alone and sum(len(t.ids) for t in alone) >= max_timers:
            break  # a run stops once it holds max_timers, after a whole record
        one = decoder.decode(record)
        if one is None or (alone and one.new_ids != alone[0].new_ids):
            break
        alone.append(one)
    assert taken == len(alone)
    if not alone:
        assert timers is None
        return
    assert timers is not None
    assert timers.new_ids == (sent[0][1] == IDS_NEW)
    assert timers.records == [r for t in alone for r in t.records]
    assert [r.offset for r in timers.records] == [r.offset for t in alone for r in t.records]
    assert timers.ids == [i for t in alone for i in t.ids]
    assert timers.id_bytes == [i for t in alone for i in t.id_bytes]
    assert timers.due_ms == [d for t in alone for d in t.due_ms]
    assert timers.callback_topics == [c for t in alone for c in t.callback_topics]
    assert timers.stored == [b for t in alone for b in t.stored]


def test_a_record_the_run_stops_at_leaves_the_checks_of_the_records_before_it_alone() -> None:
    # The batch's first timer has an id too long to store; its second has no due time, so the
    # run stops at the batch: the Future before it is judged on its own timer, and taken.
    first = Future(callBackTopic="orders", callBack=b"x", id="fine", due_ms=NOW_MS + 1_000)
    batch = FutureBatch(
        futures=[Future(callBackTopic="orders", id="é" * 256, due_ms=NOW_MS), Future(callBackTopic="orders")]
    )
    records = [
        SourceRecord(TOPICS.request, 2, 0, None, first.SerializeToString(), (), NOW_MS),
        SourceRecord(
            TOPICS.request, 2, 1, None, batch.SerializeToString(), ((KIND_HEADER, KIND_BATCH),), NOW_MS
        ),
    ]
    timers, taken = Decoder(RequestParser(WORKER, NOW_MS).context).decode_run(records, 2)
    assert taken == 1
    assert timers is not None and timers.ids == ["fine"]


def test_refused_timers_among_records_get_no_record_read_more_than_three_times(
    monkeypatch: MonkeyPatch,
) -> None:
    # Hostile or broken producers: every other record names a callback topic the worker refuses.
    # Each run that meets one is judged record by record; the records after it must not be read
    # as a run again and again (up to 500 times each), whatever their number.
    from futures.worker import columns

    reads: dict[int, int] = {}
    read_records = columns.read_records

    def counted_records(records: list[SourceRecord], *args: Any) -> Any:
        read, end = read_records(records, *args)
        for record in records[: min(end + 1, len(records))]:
            reads[record.offset] = reads.get(record.offset, 0) + 1
        return read, end

    monkeypatch.setattr(columns, "read_records", counted_records)
    records = [
        SourceRecord(
            TOPICS.request, 2, offset, None,
            Future(id=f"t{offset}", callBackTopic="elsewhere" if offset % 2 else "orders",
                   due_ms=NOW_MS + offset).SerializeToString(),
            (), NOW_MS,
        )
        for offset in range(400)
    ]  # fmt: skip
    decoder = Decoder(RequestParser(WORKER, NOW_MS).context)
    taken_ids: list[str] = []
    at = 0
    while at < len(records):
        timers, taken = decoder.decode_run(records[at : at + 500], 10_000)
        if timers is None:
            at += 1  # the general parser's: it refuses the timer
        else:
            taken_ids += timers.ids
            at += taken
    assert taken_ids == [f"t{offset}" for offset in range(0, 400, 2)]
    assert max(reads.values()) <= 3, sorted(reads.items(), key=lambda item: -item[1])[:5]


def test_a_batch_of_valid_timers_is_decoded_and_anything_doubtful_is_left_to_the_parser() -> None:
    context = RequestParser(WORKER, NOW_MS).context
    good = [Future(id=f"t{i}", due_ms=NOW_MS + i, callBackTopic="orders", callBack=b"x") for i in range(3)]

    def batch(*fs: Future) -> SourceRecord:
        value = FutureBatch(futures=fs).SerializeToString()
        return SourceRecord(TOPICS.request, 1, 5, None, value, ((KIND_HEADER, KIND_BATCH),), NOW_MS)

    timers = decode(batch(*good), context)
    assert timers is not None
    assert timers.ids == ["t0", "t1", "t2"]
    assert timers.due_ms == [NOW_MS, NOW_MS + 1, NOW_MS + 2]
    # One timer the checks refuse sends the whole record to the parser, which dead-letters it alone.
    refused = Future(id="bad", due_ms=NOW_MS, callBackTopic="elsewhere")
    assert decode(batch(*good, refused), context) is None
    # A seed Future (the due second in the key) and a cancel: the parser's.
    seed = Future(callBackTopic="orders").SerializeToString()
    assert decode(SourceRecord(TOPICS.request, 1, 5, b"1795000000", seed), context) is None
    cancel = Cancel(id="t0").SerializeToString()
    assert (
        decode(SourceRecord(TOPICS.request, 1, 5, None, cancel, ((KIND_HEADER, KIND_CANCEL),)), context)
        is None
    )


def test_timers_without_an_id_get_the_derived_one() -> None:
    context = RequestParser(WORKER, NOW_MS).context
    value = FutureBatch(futures=[Future(due_ms=NOW_MS, callBackTopic="orders")] * 2).SerializeToString()
    timers = decode(SourceRecord(TOPICS.request, 3, 9, None, value, ((KIND_HEADER, KIND_BATCH),)), context)
    assert timers is not None
    assert timers.ids == ["seed-3-9-0", "seed-3-9-1"]


def test_a_recurring_timer_is_left_to_the_parser_which_the_worker_checks_it_after() -> None:
    context = RequestParser(WORKER, NOW_MS).context
    plain = Future(id="a", due_ms=NOW_MS, callBackTopic="orders")
    series = Future(id="b", due_ms=NOW_MS, callBackTopic="orders", recurrence=Recurrence(interval_ms=60_000))
    for value, headers in (
        (series.SerializeToString(), ()),
        (FutureBatch(futures=[plain, series]).SerializeToString(), ((KIND_HEADER, KIND_BATCH),)),
    ):
        assert decode(SourceRecord(TOPICS.request, 1, 5, None, value, headers), context) is None


@settings(max_examples=300, deadline=None)
@given(
    timers=st.lists(
        st.tuples(unknown, st.text(max_size=8), st.binary(max_size=8), unknown), min_size=1, max_size=3
    ),
    between=unknown,
    batch=st.booleans(),
)
def test_valid_timers_among_unknown_fields_of_every_wire_type_are_read_as_protobuf_reads_them(
    timers: list[tuple[bytes, str, bytes, bytes]], between: bytes, batch: bool
) -> None:
    """Protobuf reads them (and keeps their unknown fields): so does this path, which stores
    each timer with them, as the parser would."""
    values = [
        before
        + Future(id=i, due_ms=NOW_MS + 5, callBackTopic="orders", callBack=p).SerializeToString()
        + after
        for before, i, p, after in timers
    ]
    if batch:
        value = b"".join(between + b"\n" + varint(len(v)) + v for v in values) + between
        records = [SourceRecord(TOPICS.request, 1, 5, None, value, ((KIND_HEADER, KIND_BATCH),), NOW_MS)]
    else:
        records = [SourceRecord(TOPICS.request, 1, 5 + n, None, v, (), NOW_MS) for n, v in enumerate(values)]
    parser = RequestParser(ParseLimits.permissive(TOPICS), NOW_MS)
    decoder = Decoder(parser.context)
    read, taken = decoder.decode_run(records, 1000)

    assert read is not None and taken == len(records)
    schedules = [r for record in records for r in parser.parse(record) if isinstance(r, Schedule)]
    assert read.ids == [s.timer_id for s in schedules]
    assert [StoredTimer.FromString(stored) for stored in read.stored] == [s.timer for s in schedules]


def test_groups_nested_as_deep_as_protobuf_reads_them_in_a_stored_timer_are_read() -> None:
    """A record's Future is stored a level down, in its StoredTimer: groups nested deeper than
    protobuf would read there are left to the parser."""
    context = RequestParser(ParseLimits.permissive(TOPICS), NOW_MS).context
    future = Future(id="a", due_ms=NOW_MS, callBackTopic="orders").SerializeToString()
    for depth, read in ((99, True), (100, False)):
        value = future + nested_groups(depth)
        timers = decode(SourceRecord(TOPICS.request, 1, 5, None, value, ()), context)
        assert (timers is not None) == read
        if timers is not None:
            assert StoredTimer.FromString(timers.stored[0]).future == Future.FromString(value)
