"""The per-partition timer table: counts, the id index, range scans, replay and restarts, memory."""

from __future__ import annotations

import gc
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from futures.worker.table import (
    FIRED_PREFIX,
    FOUND_IDS,
    INDEX_PREFIX,
    MEMTABLES,
    MEMTABLES_BYTES,
    WRITE_BUFFER_BYTES,
    PartitionTimers,
    Record,
    pack_keys,
    progress_record,
    table_key,
)
from futures.worker.table import _options as table_options
from ktimers.wire import split_timer_key

T = 1_795_000_000  # an epoch second in 2026
T_MS = T * 1000


@pytest.fixture
def table(tmp_path: Path) -> Iterator[PartitionTimers]:
    t = PartitionTimers(tmp_path / "live.db")
    yield t
    t.close()


def put(due_ms: int, timer_id: str, value: bytes | None = None) -> Record:
    return table_key(due_ms, timer_id), value if value is not None else f"{timer_id}@{due_ms}".encode()


def tomb(due_ms: int, timer_id: str) -> Record:
    return table_key(due_ms, timer_id), None


def state(t: PartitionTimers) -> tuple[int, int, list[tuple[int, str, bytes]]]:
    return t.pending, t.watermark, [(d.due_ms, d.timer_id, d.value) for d in t.iter_pending()]


# A live history, one commit per entry: (records, pending_delta as the engine computes it).
# schedule a,b,c,d → reschedule b later and c earlier → cancel d → fire what is due by T+2
# → schedule e → replace e in place (same due, new payload) → watermark T+5.
HISTORY: list[tuple[list[Record], int]] = [
    (
        [
            put(T_MS + 1000, "a"),
            put(T_MS + 2000, "b"),
            put(T_MS + 9000, "c"),
            put(T_MS + 4000, "d"),
            progress_record(T, -1),
        ],
        4,
    ),
    ([tomb(T_MS + 2000, "b"), put(T_MS + 7000, "b"), progress_record(T, -1)], 0),
    ([tomb(T_MS + 9000, "c"), put(T_MS + 1500, "c"), progress_record(T, -1)], 0),
    ([tomb(T_MS + 4000, "d"), progress_record(T, -1)], -1),
    ([tomb(T_MS + 1000, "a"), tomb(T_MS + 1500, "c"), progress_record(T + 2, -1)], -2),
    ([put(T_MS + 3000, "e"), progress_record(T + 2, -1)], 1),
    ([put(T_MS + 3000, "e", b"e-v2"), progress_record(T + 5, -1)], 0),
]
EXPECTED_PENDING = [(T_MS + 3000, "e", b"e-v2"), (T_MS + 7000, "b", f"b@{T_MS + 7000}".encode())]


def run_live(t: PartitionTimers) -> None:
    for offset, (records, delta) in enumerate(HISTORY):
        t.apply(records, offset=offset, pending_delta=delta)


def test_put_replace_and_delete_keep_pending_and_index_exact(table):
    table.apply([put(T_MS + 1000, "a"), put(T_MS + 2000, "b")], offset=0, pending_delta=2)
    assert table.pending == 2
    assert table.due_of("a") == T_MS + 1000
    assert table.get(T_MS + 2000, "b") == f"b@{T_MS + 2000}".encode()

    # Replace in place (same due time): still one timer, new value.
    table.apply([put(T_MS + 1000, "a", b"a-v2")], offset=1, pending_delta=0)
    assert table.pending == 2
    assert table.get(T_MS + 1000, "a") == b"a-v2"

    # Reschedule: the old key goes, the index follows the new one.
    table.apply([tomb(T_MS + 1000, "a"), put(T_MS + 5000, "a", b"a-v3")], offset=2, pending_delta=0)
    assert table.due_of("a") == T_MS + 5000
    assert table.get(T_MS + 1000, "a") is None
    assert table.pending == 2

    table.apply([tomb(T_MS + 2000, "b")], offset=3, pending_delta=-1)
    assert table.pending == 1
    assert table.due_of("b") is None
    assert [(d.due_ms, d.timer_id, d.value) for d in table.iter_pending()] == [(T_MS + 5000, "a", b"a-v3")]


def test_many_ids_are_looked_up_at_once_as_one_at_a_time(table):
    table.apply([put(T_MS + 1000, "a"), put(T_MS + 2000, "é")], offset=0, pending_delta=2)
    table.apply([tomb(T_MS + 1000, "a")], offset=1, pending_delta=-1)
    ids = ["a", "é", "never", "é"]
    assert table.dues_of_ids([i.encode() for i in ids]) == [None, T_MS + 2000, None, T_MS + 2000]
    assert [table.due_of(i) for i in ids] == [None, T_MS + 2000, None, T_MS + 2000]


def test_replayed_records_count_only_real_changes(table):
    # Replay (pending_delta=None) may see a put of a key it already holds, or a
    # tombstone of one it never had (compacted changelog): neither changes the count.
    table.apply([put(T_MS, "a")], offset=0)
    table.apply([put(T_MS, "a", b"again")], offset=1)
    table.apply([tomb(T_MS + 1, "never-there")], offset=2)
    assert table.pending == 1
    table.apply([tomb(T_MS, "a")], offset=3)
    table.apply([tomb(T_MS, "a")], offset=4)
    assert table.pending == 0


# A changelog's records over two ids and three due times: a put, a tombstone, or an ``f``
# record of fired timers, in any order, so that an id is put, replaced, moved, deleted and put
# again within one write.
_TIMER = st.tuples(st.sampled_from("xy"), st.sampled_from([T_MS + 1000, T_MS + 2000, T_MS + 3000]))
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _TIMER),
        st.tuples(st.just("tomb"), _TIMER),
        st.tuples(st.just("fired"), st.lists(_TIMER, min_size=1, max_size=3)),
    ),
    max_size=12,
)


def _records(ops: list) -> list[Record]:
    records: list[Record] = []
    for seq, (kind, arg) in enumerate(ops):
        if kind == "put":
            records.append(put(arg[1], arg[0], f"{arg[0]}@{arg[1]}#{seq}".encode()))
        elif kind == "tomb":
            records.append(tomb(arg[1], arg[0]))
        else:
            keys = [table_key(due, timer_id) for timer_id, due in arg]
            records.append((FIRED_PREFIX + struct.pack(">Q", seq), pack_keys(keys)[0]))
    return records


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_records_applied_in_one_write_leave_the_table_and_index_they_leave_one_at_a_time(ops):
    # One write orders its RocksDB operations by key space, not as its records come: what it
    # leaves must be what the records leave applied one by one.
    records = _records(ops)
    with tempfile.TemporaryDirectory() as tmp:
        one_by_one, at_once = PartitionTimers(Path(tmp) / "one"), PartitionTimers(Path(tmp) / "all")
        try:
            for offset, record in enumerate(records):
                one_by_one.apply([record], offset=offset)
            at_once.apply(records, offset=len(records) - 1)
            assert state(at_once) == state(one_by_one)
            assert [at_once.due_of(i) for i in "xy"] == [one_by_one.due_of(i) for i in "xy"]
            # The id index too, entry for entry: none left behind pointing at a deleted timer.
            assert list(at_once.index_entries()) == list(one_by_one.index_entries())
        finally:
            one_by_one.close()
            at_once.close()


# A live firing's write over a table of 40 timers: timers put first (which may fall among the
# fired ones), then an ``f`` record listing a run of the table's timers in due order, with holes
# (a timer kept between them) or a timer that is not there.
_LIVE_DUES = [T_MS + 1000 * n for n in range(6)]
_LIVE_FIRING = st.tuples(
    st.lists(st.tuples(st.integers(40, 60), st.sampled_from(_LIVE_DUES)), max_size=3),  # puts first
    st.integers(0, 24),  # the run's first timer, in due order
    st.integers(1, 40),  # its length
    st.sets(st.integers(0, 39), max_size=2),  # holes: timers of the run left out of the record
    st.booleans(),  # the record lists a timer the table does not hold
)


@settings(max_examples=100, deadline=None)
@given(_LIVE_FIRING)
def test_a_live_firing_deletes_exactly_the_timers_it_lists(firing):
    # Its timers usually lie together and go with one range tombstone: never one it did not list.
    puts, first, length, holes, absent = firing
    with tempfile.TemporaryDirectory() as tmp:
        table = PartitionTimers(Path(tmp) / "live")
        try:
            held = [put(_LIVE_DUES[n % 6], f"t{n:02d}") for n in range(40)]
            table.apply([*held, progress_record(T, -1)], offset=0, pending_delta=len(held))
            ordered = sorted(key for key, _ in held)
            listed = [key for n, key in enumerate(ordered[first : first + length], first) if n not in holes]
            if absent or not listed:
                listed = sorted([*listed, table_key(_LIVE_DUES[2], "t02-gone")])
            new = [put(due, f"t{n:02d}") for n, due in puts]
            record = (FIRED_PREFIX + struct.pack(">Q", 0), pack_keys(listed)[0])
            table.apply([*new, record, progress_record(T, -1)], offset=1, pending_delta=len(new))
            expected = ({key for key, _ in held} | {key for key, _ in new}) - set(listed)
            assert {key for key, _ in table._scan(b"t")} == expected
        finally:
            table.close()


def test_a_run_of_fired_timers_goes_with_one_range_tombstone_not_one_each(table):
    held = [put(T_MS + n, f"t{n:03d}") for n in range(100)]
    table.apply([*held, progress_record(T, -1)], offset=0, pending_delta=100)
    deletes = table._db.property_int_value("rocksdb.num-deletes-active-mem-table")
    record = (FIRED_PREFIX + struct.pack(">Q", 0), pack_keys([key for key, _ in held[10:90]])[0])
    table.apply([record, progress_record(T, -1)], offset=1, pending_delta=-80)
    assert table._db.property_int_value("rocksdb.num-deletes-active-mem-table") == deletes
    assert [d.timer_id for d in table.iter_pending()] == [f"t{n:03d}" for n in [*range(10), *range(90, 100)]]


def _due_ids(table, limit_ms, max_count):
    return [split_timer_key(key[1:])[1] for key, _ in table.due_items(limit_ms, max_count)]


def test_due_items_returns_exactly_the_due_timers_in_due_order(table):
    # Due times whose byte patterns differ in every position: big-endian keys
    # must still sort numerically, and ids must not disturb the order.
    dues = {"z": 1, "y": 255, "x": 256, "w": 65_536, "v": 2**32, "u": T_MS, "t": T_MS + 1, "s": T_MS + 999}
    table.apply([put(due, tid) for tid, due in dues.items()], offset=0, pending_delta=len(dues))

    found = table.due_items(T_MS, 100)
    assert [split_timer_key(key[1:]) for key, _ in found] == [
        (1, "z"),
        (255, "y"),
        (256, "x"),
        (65_536, "w"),
        (2**32, "v"),
        (T_MS, "u"),
    ]
    assert found[0] == (table_key(1, "z"), b"z@1")

    # The limit is inclusive to the millisecond.
    assert _due_ids(table, T_MS + 1, 100)[-2:] == ["u", "t"]
    assert _due_ids(table, T_MS - 1, 100)[-1] == "v"
    # ...and n caps the answer, earliest first.
    assert _due_ids(table, T_MS + 999, 3) == ["z", "y", "x"]
    assert table.due_items(0, 10) == []


def test_due_items_orders_same_due_time_by_id_and_skips_fired_seconds(table):
    table.apply(
        [put(T_MS + 1000, "b"), put(T_MS + 1000, "a"), put(T_MS + 2000, "c")], offset=0, pending_delta=3
    )
    assert _due_ids(table, T_MS + 1000, 10) == ["a", "b"]
    # Firing second T+1 deletes its timers and moves the watermark; the next scan
    # sees only what is left.
    table.apply([tomb(T_MS + 1000, "a"), tomb(T_MS + 1000, "b"), progress_record(T + 1, -1)], 1, -2)
    assert _due_ids(table, T_MS + 2000, 10) == ["c"]


def test_watermark_never_moves_backwards(table):
    table.apply([progress_record(T + 10, -1)], offset=0)
    table.apply([progress_record(T + 3, -1)], offset=1)
    assert table.watermark == T + 10


def test_replay_one_commit_at_a_time_rebuilds_the_live_table(table, tmp_path):
    run_live(table)
    assert state(table) == (2, T + 5, EXPECTED_PENDING)

    replayed = PartitionTimers(tmp_path / "replayed.db")
    for offset, (records, _) in enumerate(HISTORY):
        replayed.apply(records, offset=offset, pending_delta=None)
    try:
        assert state(replayed) == state(table)
        for tid in "abcde":
            assert replayed.due_of(tid) == table.due_of(tid), tid
        assert replayed.persisted_offset == table.persisted_offset == len(HISTORY) - 1
    finally:
        replayed.close()


def test_replay_in_one_batch_rebuilds_the_live_table(table, tmp_path):
    run_live(table)
    replayed = PartitionTimers(tmp_path / "replayed.db")
    try:
        replayed.apply([r for records, _ in HISTORY for r in records], offset=len(HISTORY) - 1)
        # The timers themselves are right...
        assert state(replayed)[1:] == state(table)[1:]
        # ...and so must be the count that the pending gauge and the table size report.
        assert replayed.pending == table.pending == 2
    finally:
        replayed.close()


def test_state_survives_close_and_reopen(tmp_path):
    path = tmp_path / "p0.db"
    first = PartitionTimers(path)
    assert (first.pending, first.watermark, first.persisted_offset) == (0, -1, None)
    run_live(first)
    before = state(first)
    first.close()

    reopened = PartitionTimers(path)
    try:
        assert state(reopened) == before
        assert reopened.persisted_offset == len(HISTORY) - 1
        assert reopened.due_of("b") == T_MS + 7000
        assert reopened.due_of("a") is None
        # A write without an offset keeps the recorded one.
        reopened.apply([progress_record(T + 6, -1)], offset=None)
        assert reopened.persisted_offset == len(HISTORY) - 1
        reopened.set_persisted_offset(42)
    finally:
        reopened.close()
    again = PartitionTimers(path)
    try:
        assert (again.persisted_offset, again.watermark, again.pending) == (42, T + 6, 2)
    finally:
        again.close()


def fill_sixteen_tables(tmp_path: Path) -> tuple[list[PartitionTimers], int]:
    """After a failover one worker holds every partition: 16 tables, each written 6 MiB (less than
    a memtable holds before it flushes), 96 MiB in all, 2,000 timers a write. The tables and the
    most their memtables held together after any write."""
    tables = [PartitionTimers(tmp_path / f"p{p}.db") for p in range(16)]
    per_table = 6 * 2**20 // 300  # timers of 200 bytes, ~300 in the memtable with their keys and index
    most = 0
    for p, table in enumerate(tables):
        records = [put(T_MS + n, f"t{p}-{n}", bytes([n % 251]) * 200) for n in range(per_table)]
        for at in range(0, per_table, 2_000):
            step = records[at : at + 2_000]
            table.apply(step, None, pending_delta=len(step))
            most = max(most, sum(table.sizes().memtables for table in tables))
    assert sum(table.pending for table in tables) == 16 * per_table
    return tables, most


def test_the_tables_memtables_share_one_budget_however_many_partitions_a_worker_holds(tmp_path: Path) -> None:
    tables, most = fill_sixteen_tables(tmp_path)
    try:
        assert most <= MEMTABLES_BYTES + WRITE_BUFFER_BYTES, f"{most / 2**20:.0f} MiB in memtables"
    finally:
        for table in tables:
            table.close()


def test_the_ids_the_tables_remember_for_their_sweeps_share_one_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each table's lookups find every id they look up (each is put again): past the cap, the
    # table noting forgets its own notes; a closed table gives its share back.
    monkeypatch.setattr(FOUND_IDS, "cap", 10_000)
    before = FOUND_IDS.used
    tables = [PartitionTimers(tmp_path / f"p{n}.db") for n in range(4)]
    try:
        for n, table in enumerate(tables):
            table.trust_listings()
            ids = [f"id{n}-{i}" for i in range(100)]
            table.apply([(table_key(T_MS, i), b"v") for i in ids], offset=0, pending_delta=len(ids))
            table.dues_of_ids([i.encode() for i in ids])
            assert before < FOUND_IDS.used <= before + 10_000
        # An id found again is remembered once.
        used = FOUND_IDS.used
        tables[0].dues_of_ids([f"id0-{i}".encode() for i in range(100)])
        assert FOUND_IDS.used == used
    finally:
        for table in tables:
            table.close()
    assert FOUND_IDS.used == before


def test_writes_wait_for_flushes_rather_than_pile_memtables_past_the_budget_behind_a_slow_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk that writes 4 MiB/s: flushes fall behind the writes.
    def slow_disk(*, index: bool) -> Options:
        opts = table_options(index=index)
        opts.set_ratelimiter(4 * 2**20, 100_000, 10)
        return opts

    monkeypatch.setattr("futures.worker.table._options", slow_disk)
    waited_s = MEMTABLES.waited_s
    tables, most = fill_sixteen_tables(tmp_path)
    try:
        assert most <= MEMTABLES_BYTES + WRITE_BUFFER_BYTES, f"{most / 2**20:.0f} MiB in memtables"
        assert MEMTABLES.waited_s > waited_s, "no write waited for a flush: the disk was not slow"
    finally:
        for table in tables:
            table.close()


def test_a_table_dropped_without_closing_is_closed_when_collected(tmp_path: Path) -> None:
    # The memtable cap keeps track of open tables; it must not keep one alive (and its
    # RocksDB lock held) once nothing else refers to it.
    table = PartitionTimers(tmp_path / "p0.db")
    table.apply([put(T_MS, "t0")], None, pending_delta=1)
    del table
    gc.collect()
    again = PartitionTimers(tmp_path / "p0.db")
    try:
        assert again.pending == 1
    finally:
        again.close()


def test_a_table_written_with_its_id_index_among_the_timers_moves_it_when_opened(tmp_path: Path) -> None:
    # The layout where one column family held everything: a timer, its index entry, its progress.
    path = tmp_path / "p0.db"
    db = Rdict(str(path), table_options(index=True))
    for n in range(25_000):
        key, _ = put(T_MS + n, f"t{n:05d}")
        db[key] = b"stored"
        db[INDEX_PREFIX + f"t{n:05d}".encode()] = key[1:9]
    db.close()

    table = PartitionTimers(path)
    try:
        assert table.due_of("t00007") == T_MS + 7
        assert table.dues_of_ids([b"t24999", b"new"]) == [T_MS + 24_999, None]
        assert len(list(table.index_entries())) == 25_000
        assert list(table._scan(INDEX_PREFIX)) == []  # none left among the timers
        # A new version replaces the moved one, as it would have in the old layout.
        table.apply([tomb(T_MS + 7, "t00007"), put(T_MS + 99_000, "t00007")], None, pending_delta=0)
        assert table.due_of("t00007") == T_MS + 99_000
    finally:
        table.close()
    reopened = PartitionTimers(path)  # the move is done once
    try:
        assert reopened.due_of("t00007") == T_MS + 99_000
        assert len(list(reopened.index_entries())) == 25_000
    finally:
        reopened.close()


def test_a_large_table_is_stored_compressed_on_disk(tmp_path: Path) -> None:
    """The levels a compaction writes, which hold nearly all of a large table, are compressed."""
    db = Rdict(str(tmp_path / "t.db"), table_options(index=False))
    raw = 0
    for n in range(60_000):
        key, value = table_key(T_MS + n, f"timer-{n}"), b"callback payload " * 8
        db[key] = value
        raw += len(key) + len(value)
    db.flush()
    db.compact_range(None, None)  # what compactions do as a table grows
    on_disk = int(db.property_int_value("rocksdb.live-sst-files-size") or 0)
    db.close()
    assert 0 < on_disk < raw / 2
