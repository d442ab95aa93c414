"""A revoked owner's late changelog writes change no restored table (futures/worker/fencing.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from faust.types import TP

from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.fencing import OWNER_HEADER, OwnerFence, header_epoch, owner_record
from futures.worker.store import TableDiverged, TimerStore
from futures.worker.table import PartitionTimers, table_key
from tests.worker.fakes import Sent
from tests.worker.rig import T_MS, MakeRig, Rig


def _headers(epoch: int | None) -> list[tuple[str, bytes | None]]:
    return [] if epoch is None else [(OWNER_HEADER, str(epoch).encode())]


def test_a_replay_skips_what_an_owner_wrote_after_a_newer_one_started() -> None:
    fence = OwnerFence()
    old, new = owner_record(3), owner_record(4)
    assert fence.admit(old[0], [])
    assert fence.admit(b"t-put-of-3", _headers(3))
    assert fence.admit(new[0], [])
    assert fence.admit(b"t-put-of-4", _headers(4))
    assert not fence.admit(b"t-late-put-of-3", _headers(3))
    assert fence.fenced == 1
    assert not fence.diverged  # this table never wrote under epoch 3


def test_records_of_writers_without_epochs_are_always_applied() -> None:
    fence = OwnerFence(epoch=7)
    assert fence.admit(b"t-legacy", [])
    assert fence.admit(b"t-legacy", None)
    assert fence.admit(b"t-garbled", [(OWNER_HEADER, b"not a number")])


def test_a_table_that_applied_a_write_the_replay_fences_has_diverged() -> None:
    fence = OwnerFence(epoch=3, written=3)
    assert fence.admit(owner_record(4)[0], [])
    assert not fence.admit(b"t-mine-late", _headers(3))
    assert fence.diverged


def test_header_epoch_reads_the_header_and_nothing_else() -> None:
    assert header_epoch([("x", b"1"), (OWNER_HEADER, b"12")]) == 12
    assert header_epoch([("x", b"1")]) is None
    assert header_epoch(None) is None


# -- end to end: two owners of one partition, and a restore from what they wrote -------------------


@dataclass
class _Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass
class _Event:
    message: _Message


def _events(records: list[Sent]) -> list[_Event]:
    """``records`` as a changelog partition holds them, offsets in order."""
    return [_Event(_Message(0, offset, s.key, s.value, list(s.headers))) for offset, s in enumerate(records)]


def _store(tmp_path: Path) -> TimerStore:
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    store = create_app(config, partitions=4).store
    assigned = {TP(config.changelog_topic, 0)}
    asyncio.run(store.on_rebalance(assigned, set(), assigned, generation_id=99))
    return store


def _restore(store: TimerStore, records: list[Sent]) -> list[str]:
    store.apply_changelog_batch(_events(records), lambda k: k, lambda v: v)
    return sorted(d.timer_id for d in store.partition(0).iter_pending())


def _own(rig: Rig, epoch: int) -> None:
    asyncio.run(rig.engine.own([0], epoch))


def _restored_into(rig: Rig, records: list[Sent]) -> None:
    """What a new owner's recovery does: the changelog read into its table, through the fence."""
    table = rig.table(0)
    fence = OwnerFence(table.owner_epoch, table.written_epoch)
    admitted = [(s.key or b"", s.value) for s in records if fence.admit(s.key or b"", s.headers)]
    table.apply(admitted, len(records) - 1, owner_epoch=fence.epoch)


def test_a_revoked_owners_late_writes_do_not_come_back_on_restore(make_rig: MakeRig, tmp_path: Path) -> None:
    old, new = make_rig(), make_rig()
    _own(old, 1)
    old.ingest(old.request("kept", T_MS + 60_000), old.request("cancelled", T_MS + 60_000))
    written_before = list(old.changelog())

    # The new owner is assigned the partition in a later generation: it opens its epoch, then
    # recovers what the old owner wrote, and cancels a timer.
    _own(new, 2)
    _restored_into(new, [*written_before, *new.changelog()])
    new.follows(old)  # it reads the requests that follow those the old owner applied
    new.ingest(new.cancel("cancelled"))
    assert new.pending_ids() == ["kept"]

    # The old owner does not know yet: it goes on writing (a new version of the cancelled
    # timer, a new timer), and Kafka appends that after the new owner's records.
    old.ingest(old.request("cancelled", T_MS + 90_000), old.request("late", T_MS + 60_000))
    late = old.changelog()[len(written_before) :]
    assert late and all(s.header(OWNER_HEADER) == b"1" for s in late)

    changelog = [*written_before, *new.changelog(), *late]
    assert _restore(_store(tmp_path / "restored"), changelog) == ["kept"]


def test_the_owner_record_lands_after_the_owners_earlier_writes_and_tags_what_follows(rig: Rig) -> None:
    rig.ingest(rig.request("before", T_MS + 60_000))  # no epoch yet: a table never assigned
    _own(rig, 5)
    rig.ingest(rig.request("after", T_MS + 60_000))
    keys = [s.key for s in rig.changelog()]
    owner_at = keys.index(owner_record(5)[0])
    assert all(s.header(OWNER_HEADER) is None for s in rig.changelog()[:owner_at])
    assert all(s.header(OWNER_HEADER) == b"5" for s in rig.changelog()[owner_at:])
    assert rig.table(0).written_epoch == 5


def test_a_table_holding_its_own_fenced_writes_is_rebuilt(tmp_path: Path) -> None:
    # This worker wrote under generation 99, and its recovery meets writes of its own that an
    # owner record after them fenced: its table applied them, which no restore does. (A worker
    # left out of a generation rebuilds a table it kept before recovery even starts, below; this
    # is for what the generations do not show.)
    store = _store(tmp_path / "store")
    table = store.partition(0)
    table.own(99)
    changelog = store.table.changelog_topic.topics
    assigned = {TP(next(iter(changelog)), 0)}

    async def own(partitions: set[int], epoch: int) -> None:
        for partition in partitions:
            store.partition(partition).own(epoch)

    store.on_assigned = own
    asyncio.run(store.on_rebalance(assigned, set(), set(), generation_id=100))
    newer = Sent(topic="c", partition=0, key=owner_record(100)[0], value=b"", headers=[], flush_no=0)
    mine_late = Sent(topic="c", partition=0, key=b"t-x", value=b"v", headers=_headers(99), flush_no=0)
    with pytest.raises(TableDiverged, match="rebuild"):
        store.apply_changelog_batch(_events([newer, mine_late]), lambda k: k, lambda v: v)
    asyncio.run(store.stop())

    reopened = _store(tmp_path / "store").partition(0)
    assert reopened.pending == 0 and reopened.persisted_offset is None and reopened.written_epoch is None


def test_the_epochs_a_table_met_survive_a_reopen(tmp_path: Path) -> None:
    table = PartitionTimers(tmp_path / "p0.db")
    table.own(4)
    table.apply([owner_record(6)], 0, owner_epoch=6)
    table.close()
    reopened = PartitionTimers(tmp_path / "p0.db")
    assert (reopened.owner_epoch, reopened.written_epoch) == (6, 4)
    reopened.close()


def test_a_table_kept_through_a_generation_this_worker_missed_is_rebuilt(tmp_path: Path) -> None:
    # Paused past its session, the worker was left out of one generation, in which another owner
    # may have written; its own late progress, landed since, would hide that from its recovery.
    store = _store(tmp_path / "store")
    changelog = next(iter(store.table.changelog_topic.topics))
    assigned = {TP(changelog, 0)}

    async def own(partitions: set[int], epoch: int) -> None:
        for partition in partitions:
            store.partition(partition).own(epoch)

    store.on_assigned = own

    def rebalance(generation: int) -> int:
        asyncio.run(store.on_rebalance(assigned, set(), set(), generation_id=generation))
        return store.partition(0).pending

    assert rebalance(5) == 0
    store.partition(0).apply([(table_key(T_MS + 60_000, "kept"), b"")], offset=3)
    assert rebalance(6) == 1  # the next generation: kept
    assert rebalance(8) == 0  # generation 7 went by without it: rebuilt
    assert store.partition(0).persisted_offset is None
    asyncio.run(store.stop())


def test_a_table_found_on_disk_is_not_judged_by_generations(tmp_path: Path) -> None:
    # A restarted process's tables: the one before it could not write late (it is gone), and a
    # group it rejoins has moved on by a generation or more whoever owned the partition meanwhile.
    store = _store(tmp_path / "store")
    store.partition(0).own(5)
    store.partition(0).apply([(table_key(T_MS + 60_000, "kept"), b"")], offset=3)
    asyncio.run(store.stop())
    again = _store(tmp_path / "store")  # assigned in generation 99
    assert again.partition(0).pending == 1
    asyncio.run(again.stop())
