"""Fired timers leave the table through ``f`` records, and the changelog through their own tombstones
written later by the sweep: a table rebuilt from the changelog — whole, compacted, before or after
the sweep — is the table that wrote it."""

from __future__ import annotations

import asyncio
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options

from futures.worker import table as table_module
from futures.worker.sweep import SLICE_KEYS
from futures.worker.table import (
    FIRED_PREFIX,
    INDEX_PREFIX,
    TIMER_PREFIX,
    PartitionTimers,
    pack_keys,
    table_key,
    unpack_keys,
)
from ktimers.timers_pb2 import Recurrence
from ktimers.wire import TimerEvent
from tests.worker.fakes import transient_error
from tests.worker.kafka_log import PartitionLog, compact, restore
from tests.worker.rig import T_MS, MakeRig, Rig, T, new_rig
from tests.worker.test_series import series


def _state(table: PartitionTimers) -> tuple[list[tuple[str, int, bytes]], dict[str, int | None], int]:
    pending = [(d.timer_id, d.due_ms, d.value) for d in table.iter_pending()]
    return pending, {timer_id: table.due_of(timer_id) for timer_id, _, _ in pending}, table.pending


def _rebuilt(rig: Rig, name: str, records: list[tuple[bytes, bytes | None]]) -> PartitionTimers:
    table = PartitionTimers(rig.directory / name)
    for start in range(0, len(records), 7):  # replay batches that cut writes anywhere
        table.apply(records[start : start + 7], offset=None)
    return table


def _compacted(records: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
    """What a compacted changelog keeps at worst: each key's last record, and no tombstones."""
    last = {key: i for i, (key, _) in enumerate(records)}
    return [(key, value) for i, (key, value) in enumerate(records) if last[key] == i and value is not None]


def _hot_second(rig: Rig, n: int = 3000) -> None:
    rig.ingest(*(rig.request(f"t{i:05d}", T_MS + (i * 7919) % 1000) for i in range(n)))
    rig.ingest(rig.request("later", T_MS + 5000))
    rig.tick(T + 1)


def test_a_firing_deletes_its_timers_with_few_records_and_the_sweep_tombstones_each(
    make_rig: MakeRig,
) -> None:
    rig = make_rig(fire_chunk_size=3000)
    _hot_second(rig)
    fired = set(rig.fired())
    assert len(fired) == 3000
    listing = [s for s in rig.changelog() if (s.key or b"").startswith(FIRED_PREFIX)]
    assert 0 < len(listing) <= 6  # one per piece, not one per timer
    assert {key[9:].decode() for key, _ in rig.deletions()} == fired
    assert rig.table(0).fired_listings(10**9)

    before = len(rig.changelog())
    asyncio.run(rig.sweep())
    swept = rig.changelog()[before:]
    tombstoned = {(s.key or b"")[9:].decode() for s in swept if (s.key or b"").startswith(TIMER_PREFIX)}
    assert tombstoned == fired and all(s.value is None for s in swept if s.key != b"m:progress")
    # Each listing's tombstone after the timers it listed.
    assert {s.key for s in swept if (s.key or b"").startswith(FIRED_PREFIX)} == {s.key for s in listing}
    assert rig.table(0).fired_listings(10**9) == []
    assert rig.pending_ids() == ["later"]


def test_a_sweep_step_lets_the_event_loop_run_while_it_reads(make_rig: MakeRig) -> None:
    """Precise windows send without the engine lock: a step of thousands of timers must not hold
    back, in one go, the callbacks due while it reads."""
    rig = make_rig(fire_chunk_size=3000)
    _hot_second(rig)
    turns = 0

    async def sweep_beside_a_sender() -> None:
        nonlocal turns
        sweeping = asyncio.ensure_future(rig.sweep())
        while not sweeping.done():
            turns += 1
            await asyncio.sleep(0)
        await sweeping

    asyncio.run(sweep_beside_a_sender())
    assert rig.table(0).fired_listings(10**9) == []
    assert turns >= 3000 // SLICE_KEYS


def test_a_sweep_step_gives_way_to_a_tick_and_the_next_goes_on_where_it_stopped(make_rig: MakeRig) -> None:
    rig = make_rig(fire_chunk_size=3000)
    _hot_second(rig)
    fired = set(rig.fired())
    before = len(rig.changelog())
    asked = 0

    def a_tick_after_two_slices() -> bool:
        nonlocal asked
        asked += 1
        return asked > 2

    assert asyncio.run(rig.engine._sweep.step(give_way=a_tick_after_two_slices))  # more to sweep
    cut = rig.changelog()[before:]
    assert len([s for s in cut if (s.key or b"").startswith(TIMER_PREFIX)]) == 2 * SLICE_KEYS
    assert not [s for s in cut if (s.key or b"").startswith(FIRED_PREFIX)]  # its record stays

    asyncio.run(rig.sweep())
    swept = rig.changelog()[before:]
    tombstoned = [(s.key or b"")[9:].decode() for s in swept if (s.key or b"").startswith(TIMER_PREFIX)]
    assert sorted(tombstoned) == sorted(fired)  # each fired timer once
    assert rig.table(0).fired_listings(10**9) == []
    # Each record's tombstone after those of every timer it lists.
    listings = {s.key: s.value for s in rig.changelog()[:before] if (s.key or b"").startswith(FIRED_PREFIX)}
    for at, record in enumerate(swept):
        if (record.key or b"").startswith(FIRED_PREFIX):
            listed = set(unpack_keys(listings[record.key] or b""))
            assert listed and not listed & {s.key for s in swept[at:]}


def test_a_table_rebuilt_from_the_changelog_is_the_same_before_and_after_the_sweep_compacted_or_not(
    make_rig: MakeRig,
) -> None:
    rig = make_rig(fire_chunk_size=1000)
    _hot_second(rig)
    # The same id due at the same time again after it fired, its callback failing for now: pending
    # under the key an ``f`` record lists, and no sweep may delete it.
    rig.producer.fail = lambda topic: transient_error() if topic == "orders" else None
    rig.ingest(rig.request("t00000", T_MS, payload=b"again"))
    rig.producer.fail = lambda topic: None
    live = _state(rig.table(0))
    assert [timer_id for timer_id, _, _ in live[0]] == ["t00000", "later"] and live[2] == 2
    unswept = [(s.key or b"", s.value) for s in rig.changelog()]
    asyncio.run(rig.sweep())
    assert _state(rig.table(0)) == live
    swept = [(s.key or b"", s.value) for s in rig.changelog()]
    for name, records in [
        ("unswept", unswept),
        ("unswept-compacted", _compacted(unswept)),
        ("swept", swept),
        ("swept-compacted", _compacted(swept)),
    ]:
        table = _rebuilt(rig, name, records)
        try:
            assert _state(table) == live, name
        finally:
            table.close()
    # Compacted after the sweep, only the pending timers are left of the timers' records.
    kept = [key for key, _ in _compacted(swept) if key.startswith((TIMER_PREFIX, FIRED_PREFIX))]
    assert len(kept) == 2


def _cut_after(slices: int):
    asked = 0

    def a_tick_comes() -> bool:
        nonlocal asked
        asked += 1
        return asked > slices

    return a_tick_comes


def test_each_partitions_sweep_goes_on_where_it_stopped_when_another_was_cut_short_since(
    make_rig: MakeRig,
) -> None:
    # Partition 1's sweep is cut short, an id it swept is scheduled again, then partition 0's
    # sweep (taken first) is cut short too: partition 1's must go on where it stopped, not
    # sweep what it swept over again and take the new timer's index entry for a stale one.
    rig = make_rig(fire_chunk_size=3000)
    rig.ingest(*(rig.request(f"b{i:04d}", T_MS + i % 1000, partition=1) for i in range(1000)))
    rig.tick(T + 1, partitions=(1,))
    assert asyncio.run(rig.engine._sweep.step(give_way=_cut_after(2)))
    rig.ingest(rig.request("b0000", T_MS + 9000, partition=1))
    rig.ingest(*(rig.request(f"a{i:04d}", T_MS + i % 1000) for i in range(1000)))
    rig.tick(T + 1, partitions=(0,))
    assert asyncio.run(rig.engine._sweep.step(give_way=_cut_after(1)))
    asyncio.run(rig.sweep())
    assert rig.table(1).fired_listings(10**9) == [] == rig.table(0).fired_listings(10**9)
    assert rig.table(1).due_of("b0000") == T_MS + 9000
    rig.ingest(rig.cancel("b0000", partition=1))
    assert [e.id for e in rig.events(TimerEvent.Kind.CANCELLED)] == ["b0000"]


def test_a_sweep_resumed_after_another_owner_reused_its_records_key_leaves_no_fired_timer_to_compaction(
    make_rig: MakeRig,
) -> None:
    # Owner A's sweep of a 1,000-timer f record is cut short, then the partition goes to B, whose
    # table, restarted once it swept that record, numbers its next f record the same. A gets the
    # partition back with that record in its table: its sweep must tombstone every timer of it.
    log = PartitionLog()
    a = make_rig(fire_chunk_size=3000)
    a.ingest(*(a.request(f"a{i:04d}", T_MS + i % 1000) for i in range(1000)))
    a.tick(T + 1)
    [first] = [s.key for s in a.changelog() if (s.key or b"").startswith(FIRED_PREFIX)]
    assert asyncio.run(a.engine._sweep.step(give_way=_cut_after(1)))  # more to sweep
    a.owned = {1, 2, 3}
    a.engine.revoke([0])
    asyncio.run(a.engine.settle_revoked())
    log.append(a.changelog())
    a_read, a_wrote = log.end, len(a.changelog())

    b = make_rig(fire_chunk_size=3000)
    b.follows(a)
    restore(b.table(0), log.read())
    b.tick(T + 2)  # notes the partition for its sweep
    asyncio.run(b.sweep())
    log.append(b.changelog())
    b.close()
    b = new_rig(b.directory, fire_chunk_size=3000)  # B restarts on its data dir
    try:
        b.follows(a)
        b.ingest(*(b.request(f"b{i:04d}", T_MS + 3000 + i % 1000) for i in range(1000)))
        b.tick(T + 4)
        assert len(b.fired()) == 1000
        assert [s.key for s in b.changelog() if (s.key or b"").startswith(FIRED_PREFIX)] == [first]
        log.append(b.changelog())
    finally:
        b.close()

    restore(a.table(0), log.read(a_read))  # A catches up from where its table stopped
    a.follows(b)
    a.owned = {0, 1, 2, 3}
    a.tick(T + 5)
    asyncio.run(a.sweep())
    assert a.table(0).fired_listings(10**9) == [] and a.pending_ids() == []
    log.append(a.changelog()[a_wrote:])

    for name, records in [
        ("whole", log.read()),
        ("compacted", compact(log.read())),
        ("compacted, tombstones expired", compact(log.read(), expire_tombstones=True)),
    ]:
        restored = PartitionTimers(a.directory / name)
        try:
            restore(restored, records)
            back = [d.timer_id for d in restored.iter_pending()]
            assert back == [], f"{name}: {len(back)} fired timers back, {back[:3]}..."
            assert restored.fired_listings(10**9) == []
        finally:
            restored.close()


@pytest.mark.parametrize("revoked", ["after the step", "during the step"])
def test_a_sweep_cut_short_by_a_revocation_starts_its_record_again_and_keeps_new_entries(
    make_rig: MakeRig, revoked: str
) -> None:
    # Revoked and handed straight back (an eager rebalance): the cut sweep starts its record over,
    # so it meets an id it swept over and that was scheduled again since, whose new index entry
    # no lookup noted. That entry must stay, or the timer could no longer be cancelled.
    rig = make_rig(fire_chunk_size=3000)
    rig.ingest(*(rig.request(f"b{i:04d}", T_MS + i % 1000) for i in range(1000)))
    rig.tick(T + 1)

    def revoke() -> None:
        rig.owned = {1, 2, 3}
        rig.engine.revoke([0])

    if revoked == "after the step":
        assert asyncio.run(rig.engine._sweep.step(give_way=_cut_after(2)))
        revoke()
    else:
        slices = _cut_after(2)

        def revoked_after_two_slices() -> bool:
            if slices():
                revoke()
            return False

        asyncio.run(rig.engine._sweep.step(give_way=revoked_after_two_slices))
        assert rig.table(0).fired_listings(10**9)  # its record is left
    rig.owned = {0, 1, 2, 3}
    rig.ingest(rig.request("b0000", T_MS + 9000))
    rig.tick(T + 2)
    asyncio.run(rig.sweep())
    assert rig.table(0).fired_listings(10**9) == []
    assert rig.table(0).due_of("b0000") == T_MS + 9000
    rig.ingest(rig.cancel("b0000"))
    assert [e.id for e in rig.events(TimerEvent.Kind.CANCELLED)] == ["b0000"]


def _indexed_ids(table: PartitionTimers) -> set[str]:
    return {key[len(INDEX_PREFIX) :].decode() for key, _ in table.index_entries()}


def test_a_fired_timer_is_not_pending_to_a_cancel_or_a_new_version_before_the_sweep(
    make_rig: MakeRig,
) -> None:
    # A firing deletes its timers and leaves their id index entries to the sweep: until then,
    # an entry whose timer is gone must count for nothing.
    rig = make_rig()
    rig.ingest(rig.request("x", T_MS + 500), rig.request("y", T_MS + 600))
    rig.tick(T + 1)
    assert rig.fired() == ["x", "y"]
    assert rig.table(0).due_of("x") is None and rig.table(0).dues_of_ids([b"x", b"y", b"z"]) == [None] * 3
    writes = len(rig.changelog())
    rig.ingest(rig.cancel("x"))
    assert [e.id for e in rig.events(TimerEvent.Kind.CANCEL_MISSED)] == ["x"]
    assert rig.events(TimerEvent.Kind.CANCELLED) == []
    # A new version of y, later: nothing to replace, so no tombstone of the fired one.
    rig.ingest(rig.request("y", T_MS + 2500, payload=b"again"))
    added = [s.key for s in rig.changelog()[writes:] if (s.key or b"").startswith(TIMER_PREFIX)]
    assert [key[9:] for key in added] == [b"y"] and rig.table(0).pending == 1
    rig.tick(T + 3)
    assert rig.fired() == ["x", "y", "y"]
    assert rig.table(0).pending == 0


def test_the_sweep_takes_the_index_entries_of_the_timers_it_tombstones(make_rig: MakeRig) -> None:
    rig = make_rig(fire_chunk_size=1000)
    _hot_second(rig, n=500)
    # y fired, then scheduled again under another due time: its entry points at the new one.
    rig.ingest(rig.request("t00001", T_MS + 9000))
    asyncio.run(rig.sweep())
    assert _indexed_ids(rig.table(0)) == {"later", "t00001"}
    assert rig.table(0).due_of("t00001") == T_MS + 9000


def test_a_table_that_forgets_the_ids_it_found_reads_the_entries_of_what_it_listed_before(
    make_rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every id found is one too many to remember: the sweep reads the entries of the timers
    # listed before, and keeps those the ids put again made.
    monkeypatch.setattr(table_module.FOUND_IDS, "cap", 0)
    rig = make_rig(fire_chunk_size=1000)
    _hot_second(rig, n=500)
    rig.ingest(rig.request("t00001", T_MS + 9000))
    rig.ingest(rig.request("t00002", T_MS + 9000))
    asyncio.run(rig.sweep())
    assert _indexed_ids(rig.table(0)) == {"later", "t00001", "t00002"}
    rig.ingest(rig.cancel("t00001"))
    assert [e.id for e in rig.events(TimerEvent.Kind.CANCELLED)] == ["t00001"]


def test_a_series_swept_between_two_occurrences_can_still_be_cancelled(make_rig: MakeRig) -> None:
    rig = make_rig()
    rig.ingest(series(rig, "s", T_MS + 500, Recurrence(interval_ms=2000)))
    rig.tick(T + 1)  # the first occurrence fires, the second is armed in the same write
    asyncio.run(rig.sweep())
    assert rig.table(0).due_of("s") == T_MS + 2500
    rig.ingest(rig.cancel("s"))
    assert [e.id for e in rig.events(TimerEvent.Kind.CANCELLED)] == ["s"]
    rig.tick(T + 3)
    assert rig.fired() == ["s"]


def test_a_table_that_missed_the_sweeps_own_write_loses_its_stale_entries_on_replay(
    make_rig: MakeRig,
) -> None:
    rig = make_rig(fire_chunk_size=1000)
    _hot_second(rig, n=500)
    # The table as it was when the sweep wrote the changelog, and died before its own write.
    path = rig.table(0).path
    rig.table(0).close()
    shutil.copytree(path, rig.directory / "crashed.db")
    rig.tables[0] = PartitionTimers(path)
    before = len(rig.changelog())
    asyncio.run(rig.sweep())
    crashed = PartitionTimers(rig.directory / "crashed.db")
    try:
        assert len(_indexed_ids(crashed)) == 501
        crashed.apply([(s.key or b"", s.value) for s in rig.changelog()[before:]], offset=None)
        assert _indexed_ids(crashed) == {"later"} == _indexed_ids(rig.table(0))
    finally:
        crashed.close()


def test_a_restarted_worker_sweeps_what_the_one_before_fired(make_rig: MakeRig) -> None:
    rig = make_rig(fire_chunk_size=1000)
    _hot_second(rig, n=500)
    records = [(s.key or b"", s.value) for s in rig.changelog()]
    restarted = make_rig(fire_chunk_size=1000)
    restarted.table(0).apply(records, offset=None)  # recovered from the changelog
    assert restarted.table(0).fired_listings(10**9)
    restarted.tick(T + 2)  # its first tick notes the partition for the sweep
    asyncio.run(restarted.sweep())
    assert restarted.table(0).fired_listings(10**9) == []
    tombstoned = [
        s for s in restarted.changelog() if (s.key or b"").startswith(TIMER_PREFIX) and s.value is None
    ]
    assert len(tombstoned) == 500
    # New listings after a restart never reuse a key the table still holds.
    assert restarted.table(0).fired_records([b"tx"])[0][0] > max(
        key for key, _ in records if key.startswith(b"f")
    )


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=200), st.integers(min_value=1, max_value=2000))
def test_packed_keys_come_back_as_they_went_in_each_record_within_its_bytes(
    keys: list[bytes], most: int
) -> None:
    values = pack_keys(keys, most)
    assert [key for value in values for key in unpack_keys(value)] == keys
    assert all(len(value) <= most or len(unpack_keys(value)) == 1 for value in values)


@given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=50))
def test_an_f_records_value_lists_each_key_after_its_big_endian_two_byte_length(keys: list[bytes]) -> None:
    # The changelog holds these values: a worker reads those an older or newer one wrote.
    laid_out = b"".join(struct.pack(">H", len(key)) + key for key in keys)
    assert pack_keys(keys, len(laid_out)) == [laid_out]
    assert unpack_keys(laid_out) == keys


@given(st.binary(max_size=400))
def test_any_bytes_read_as_an_f_records_value_give_its_keys_or_a_clear_error(value: bytes) -> None:
    try:
        keys = unpack_keys(value)
    except ValueError as exc:
        assert "f record" in str(exc)
    else:
        assert pack_keys(keys, len(value) or 1) == ([value] if value else [])


def test_a_key_too_long_to_list_is_refused_not_cut() -> None:
    with pytest.raises(ValueError, match="longer than an f record lists"):
        pack_keys([b"k" * 70_000])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40), st.sampled_from(["pending", "fired", "fired, put again", "fired, moved"])
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([64, 1 << 20]),
    st.sampled_from(["entries read", "entries trusted", "entries trusted, puts replayed"]),
)
def test_the_sweep_takes_exactly_the_listed_timers_the_table_no_longer_holds(
    timers: list[tuple[int, str]], record_bytes: int, how: str
) -> None:
    # Timers left pending among those fired (more or fewer than the fired: both ways of reading
    # them), fired ones put again under the same key, or moved to another due time; the index
    # entries read by the sweep, or known unread by a table whose live puts look their ids up
    # first (as ingest does), or whose puts came from a replay of the changelog instead.
    with tempfile.TemporaryDirectory() as directory:
        table = PartitionTimers(Path(directory) / "t.db")
        try:
            if how != "entries read":
                table.trust_listings()
            keys = [table_key(T_MS + due * 10, f"t{n}") for n, (due, _) in enumerate(timers)]
            table.dues_of_ids([f"t{n}".encode() for n in range(len(keys))])
            table.apply([(key, b"v") for key in keys], offset=0, pending_delta=len(keys))
            fired = [key for key, (_, fate) in zip(keys, timers, strict=True) if fate != "pending"]
            table.apply(table.fired_records(fired, record_bytes), offset=1, pending_delta=-len(fired))
            again = [
                (key, b"again")
                for key, (_, fate) in zip(keys, timers, strict=True)
                if fate == "fired, put again"
            ]
            moved = [
                (table_key(T_MS + 10**6, f"t{n}"), b"moved")
                for n, (_, fate) in enumerate(timers)
                if fate == "fired, moved"
            ]
            if how == "entries trusted, puts replayed":
                table.apply(again + moved, offset=None)
            else:
                table.dues_of_ids([key[9:] for key, _ in again + moved])
                table.apply(again + moved, offset=2, pending_delta=len(again) + len(moved))

            listings = table.fired_listings(10**9)
            assert [key for _, listed in listings for key in listed] == fired
            # Read a listing at a time, as the sweep reads slices of them.
            found = [table.unswept(listed, fired_key) for fired_key, listed in listings]
            gone = [
                key for key, (_, fate) in zip(keys, timers, strict=True) if fate in ("fired", "fired, moved")
            ]
            assert [key for unswept in found for key in unswept.gone] == gone
            assert sorted(index_key for unswept in found for index_key in unswept.stale_index) == sorted(
                INDEX_PREFIX + key[9:] for key, (_, fate) in zip(keys, timers, strict=True) if fate == "fired"
            )
        finally:
            table.close()


def test_an_idle_table_steps_over_none_of_the_tombstones_a_swept_burst_left(
    make_rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fired and swept, a burst leaves its id index entries as tombstones until a compaction, which
    # a table that receives nothing does not start. Each tick reads the table (the sweep's listing,
    # the low mark): counted by RocksDB, those reads must stop at their own key range.
    real_options = table_module._options
    counted: list[Options] = []

    def options_with_statistics(*, index: bool) -> Options:
        options = real_options(index=index)
        options.enable_statistics()
        counted.append(options)
        return options

    def skipped() -> int:
        return sum(
            int(line.split(":")[1])
            for options in counted
            for line in (options.get_statistics() or "").splitlines()
            if line.startswith("rocksdb.number.iter.skip ")
        )

    monkeypatch.setattr(table_module, "_options", options_with_statistics)
    rig = make_rig(fire_chunk_size=3000)
    rig.ingest(*(rig.request(f"t{i:05d}", T_MS + (i * 7919) % 1000) for i in range(3000)))
    rig.tick(T + 1)
    asyncio.run(rig.sweep())
    assert len(rig.fired()) == 3000 and rig.pending_ids() == []
    before = skipped()
    for second in range(T + 2, T + 12):  # ten idle seconds
        rig.tick(second)
        asyncio.run(rig.sweep())
    table = rig.table(0)
    assert table.fired_listings(10**9) == [] and table.low_ms is None
    assert list(table.iter_range(0, T_MS + 10**6)) == []
    assert skipped() - before < 100  # not the 3,000 index tombstones, once a tick or more
