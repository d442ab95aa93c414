"""A key a revoked owner wrote late is written again by its new owner, so that compaction, which
keeps each key's latest record, never leaves a restore only the fenced one (futures/worker/restate.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from futures.ingress.records import SourceRecord
from futures.worker.fencing import OWNER_HEADER, OwnerFence, owner_record
from futures.worker.fired_keys import pack_keys, unpack_keys
from futures.worker.restate import fenced_keys, restatement
from futures.worker.table import FIRED_PREFIX, PROGRESS_KEY, PartitionTimers, progress_record, table_key
from tests.worker.fakes import Sent
from tests.worker.rig import T_MS, MakeRig, Rig
from tests.worker.test_fencing import _restore, _store


class _Log:
    """A changelog partition read back: what the gap reader returns for a range."""

    def __init__(self, records: list[SourceRecord]) -> None:
        self.records = records
        self.reads: list[tuple[int, int]] = []

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        self.reads.append((start, end))
        return [r for r in self.records if start <= r.offset < end]


def _late(offset: int, key: bytes, value: bytes | None, epoch: int) -> SourceRecord:
    return SourceRecord("changelog", 0, offset, key, value, ((OWNER_HEADER, str(epoch).encode()),))


def test_each_key_is_written_again_as_the_table_holds_it(tmp_path: Path) -> None:
    table = PartitionTimers(tmp_path / "t.db")
    held, gone, again = table_key(T_MS, "held"), table_key(T_MS, "gone"), table_key(T_MS + 1000, "again")
    table.apply([(held, b"h"), (again, b"a")], 5)
    fired = FIRED_PREFIX + b"\x00" * 7 + b"\x01"
    # An f record of this table's that lists a timer gone and one put again since.
    table.apply([(fired, next(iter(pack_keys([gone, again], 1 << 16))))], 6)
    table.apply([(again, b"a2")], 7)
    records = dict(restatement(table, [held, gone, PROGRESS_KEY, fired, held]))
    assert records[held] == b"h" and records[gone] is None
    assert PROGRESS_KEY not in records  # every write ends with one
    # Written again later, the f record must not delete the timer put again since.
    listed = records[fired]
    assert listed is not None and unpack_keys(listed) == [gone]


def test_only_records_of_an_older_owner_are_restated() -> None:
    log = _Log(
        [
            _late(3, b"t-old", None, 1),
            _late(4, b"t-mine", b"v", 2),
            _late(5, b"t-newer", b"v", 3),
            _late(6, owner_record(1)[0], owner_record(1)[1], 1),
            SourceRecord("changelog", 0, 7, b"t-no-epoch", b"v"),
        ]
    )
    assert asyncio.run(fenced_keys(log, "changelog", 0, 3, 8, 2)) == [b"t-old"]


def test_a_progress_record_that_lands_beyond_its_write_keeps_the_table_before_the_range(
    tmp_path: Path,
) -> None:
    table = PartitionTimers(tmp_path / "t.db")
    table.apply([(b"t-x", b"v")], 9)
    assert table.next_offset == 10
    table.progress_landed(progress_record(1, 1), 10, T_MS)
    assert (table.persisted_offset, table.next_offset) == (10, 11)
    table.landed_beyond(11, 14)  # two records of someone else's in between
    table.progress_landed(progress_record(2, 2), 14, T_MS)
    assert table.unread == [(11, 14)] and table.next_offset == 15
    table.close()
    assert PartitionTimers(tmp_path / "t.db").persisted_offset == 10  # a restart reads the range again


def _own(rig: Rig, epoch: int) -> None:
    asyncio.run(rig.engine.own([0], epoch))


def _compacted(records: list[Sent]) -> list[Sent]:
    """What compaction leaves of ``records``: each key's latest, in log order."""
    latest = {s.key: n for n, s in enumerate(records)}
    return [s for n, s in enumerate(records) if latest[s.key] == n]


def test_a_timer_a_fenced_owner_deleted_late_survives_compaction(make_rig: MakeRig, tmp_path: Path) -> None:
    old, new = make_rig(), make_rig()
    _own(old, 1)
    old.ingest(old.request("kept", T_MS + 60_000))
    written_before = list(old.changelog())

    _own(new, 2)
    table = new.table(0)
    fence = OwnerFence(table.owner_epoch, table.written_epoch)
    before = [*written_before, *new.changelog()]
    table.apply(
        [(s.key or b"", s.value) for s in before if fence.admit(s.key or b"", s.headers)], len(before) - 1
    )
    new.follows(old)
    new.producer._next_offset[(new.config.changelog_topic, 0)] = len(before)  # noqa: SLF001
    assert new.pending_ids() == ["kept"]

    # The old owner, not knowing yet, cancels the timer; its tombstone lands between the new
    # owner's writes, where only the new owner's progress record's offset shows it.
    late_cancel = next(s for s in old.changelog() if s.key and b"kept" in s.key)
    old.ingest(old.cancel("kept"))
    tombstone = next(s for s in old.changelog()[len(written_before) :] if s.key == late_cancel.key)
    assert tombstone.value is None
    new.engine._ctx.reader = _Log([_late(len(before), tombstone.key or b"", None, 1)])  # noqa: SLF001
    new.producer._next_offset[(new.config.changelog_topic, 0)] += 1  # noqa: SLF001
    changelog_before = len(new.changelog())
    new.ingest(new.request("other", T_MS + 60_000))
    new.ingest(new.request("third", T_MS + 60_000))

    rewritten = [s for s in new.changelog()[changelog_before:] if s.key == tombstone.key]
    assert rewritten and rewritten[0].value == late_cancel.value
    assert new.metrics.restated._value.get() == 1  # noqa: SLF001
    # Compaction keeps the rewritten put, after the fenced tombstone: a restore has the timer.
    log = [*before, tombstone, *new.changelog()[changelog_before:]]
    assert "kept" in _restore(_store(tmp_path / "restored"), _compacted(log))


def test_a_recovery_that_skips_a_fenced_record_restates_its_key(tmp_path: Path) -> None:
    store = _store(tmp_path)
    key = table_key(T_MS, "late")
    records = [
        Sent("c", 0, owner_record(98)[0], owner_record(98)[1], [], 0),
        Sent("c", 0, owner_record(99)[0], owner_record(99)[1], [], 0),
        Sent("c", 0, key, b"v", [(OWNER_HEADER, b"98")], 0),
    ]
    _restore(store, records)
    assert store.partition(0).restate == {key}


_headers = st.lists(
    st.tuples(st.sampled_from([OWNER_HEADER, "kt-id", "x"]), st.one_of(st.none(), st.binary(max_size=12))),
    max_size=3,
)


@given(
    st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=20)), _headers), max_size=20),
    st.integers(min_value=0, max_value=2**63),
)
def test_any_record_read_back_is_restated_or_left_alone_never_an_error(
    records: list[tuple[bytes | None, list[tuple[str, bytes | None]]]], epoch: int
) -> None:
    log = _Log([SourceRecord("c", 0, n, key, b"v", tuple(h)) for n, (key, h) in enumerate(records)])
    keys = asyncio.run(fenced_keys(log, "c", 0, 0, len(records), epoch))
    assert set(keys) <= {key for key, _ in records if key is not None}
