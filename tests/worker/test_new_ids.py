"""Requests whose ids the client drew (``kt-ids: new``): stored without an id lookup, and still
timers like any other — they fire once, a cancel or a schedule by their id finds them.

The records come from the client's own builders, so these tests hold the client and the
worker to one contract.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from futures.client.records import TimerRecord, TimerSpec, build_batches, build_schedule
from futures.ingress.records import SourceRecord
from futures.worker.table import PROGRESS_KEY, PartitionTimers
from ktimers.config import CommonConfig
from ktimers.wire import IDS_HEADER, IDS_NEW, header_value
from tests.worker.rig import T_MS, Kind, Rig, T, new_rig

COMMON = CommonConfig()


def _source(rig: Rig, record: TimerRecord) -> SourceRecord:
    """``record`` as the worker consumes it, in partition 0."""
    return rig.raw_request(record.key, record.value, tuple(record.headers))


def _schedule(rig: Rig, due_ms: int, **options: Any) -> tuple[SourceRecord, str]:
    record, handle = build_schedule(
        COMMON, "orders", "k", b"v", now=rig.now / 1000, at=due_ms / 1000, **options
    )
    return _source(rig, record), handle.id


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every id the tables look up, as ingest asks them."""
    asked: list[bytes] = []
    many, one = PartitionTimers.dues_of_ids, PartitionTimers.due_of_id

    def dues_of_ids(self: PartitionTimers, ids: list[bytes]) -> list[int | None]:
        asked.extend(ids)
        return many(self, ids)

    def due_of_id(self: PartitionTimers, timer_id: bytes) -> int | None:
        asked.append(timer_id)
        return one(self, timer_id)

    monkeypatch.setattr(PartitionTimers, "dues_of_ids", dues_of_ids)
    monkeypatch.setattr(PartitionTimers, "due_of_id", due_of_id)
    return asked


def test_the_client_says_so_only_of_the_ids_it_draws() -> None:
    drawn, _ = build_schedule(COMMON, "orders", "k", b"v", now=T, delay=5)
    named, _ = build_schedule(COMMON, "orders", "k", b"v", now=T, delay=5, id="order-17")
    assert header_value(drawn.headers, IDS_HEADER) == IDS_NEW
    assert header_value(named.headers, IDS_HEADER) is None
    specs = [TimerSpec("orders", f"k{n}", b"v", delay=5, id=None if n % 2 else f"n{n}") for n in range(10)]
    records, handles = build_batches(COMMON, specs, partitions=1, partition_of=lambda key, count: 0, now=T)
    # Drawn and named ids never share a batch record: the header speaks for every id in it.
    assert sorted(header_value(r.headers, IDS_HEADER) or b"" for r in records) == [b"", IDS_NEW]
    assert len(handles) == 10


def test_new_ids_are_not_looked_up_and_the_others_are(rig: Rig, lookups: list[bytes]) -> None:
    drawn = [_schedule(rig, T_MS - 500) for _ in range(3)]
    named, named_id = _schedule(rig, T_MS - 400, id="order-17")
    # One step, one partition: the consumer hands them over together, and the worker reads the
    # consecutive records as one run where it can.
    rig.ingest(drawn[0][0], drawn[1][0], named, drawn[2][0])
    assert lookups == [named_id.encode()]
    rig.tick(T)
    assert sorted(rig.fired()) == sorted([*(timer_id for _, timer_id in drawn), named_id])


def test_a_timer_with_a_drawn_id_is_cancelled_and_replaced_by_its_id(rig: Rig) -> None:
    cancelled_record, cancelled = _schedule(rig, T_MS + 1_500)
    moved_record, moved = _schedule(rig, T_MS + 1_500)
    kept_record, kept = _schedule(rig, T_MS + 1_500)
    rig.ingest(cancelled_record, moved_record, kept_record)
    # A schedule by the handle's id names it: no kt-ids header, so it replaces the pending one.
    again, same = _schedule(rig, T_MS + 5_500, id=moved)
    assert same == moved
    rig.ingest(rig.cancel(cancelled), again)

    rig.tick(T + 2)
    assert rig.fired() == [kept]
    rig.tick(T + 6)
    assert rig.fired() == [kept, moved]  # once, at its new time
    assert [e.id for e in rig.events(Kind.CANCELLED)] == [cancelled]


def test_a_batch_of_drawn_ids_fires_every_timer_once(rig: Rig, lookups: list[bytes]) -> None:
    specs = [TimerSpec("orders", f"k{n}", b"v", at=(T_MS - 900 + n) / 1000) for n in range(200)]
    records, handles = build_batches(
        COMMON, specs, partitions=1, partition_of=lambda key, count: 0, now=rig.now / 1000, batch_size=64
    )
    rig.ingest(*(_source(rig, r) for r in records))
    assert lookups == []
    assert rig.table(0).pending == 200
    rig.tick(T)
    fired = rig.fired()
    assert sorted(fired) == sorted(h.id for h in handles) and len(set(fired)) == 200
    assert rig.table(0).pending == 0


def _drawn_batches(rig: Rig, count: int) -> list[SourceRecord]:
    """``count`` timers with ids the client drew (``kt-ids: new``), due in T + 1, in batch records."""
    specs = [TimerSpec("orders", f"k{n}", b"v", at=(T_MS + 100 + n) / 1000) for n in range(count)]
    records, _ = build_batches(
        COMMON, specs, partitions=1, partition_of=lambda key, count: 0, now=rig.now / 1000, batch_size=16
    )
    return [_source(rig, r) for r in records]


def _pending_is_exact(table: PartitionTimers, count: int) -> None:
    assert len(list(table.iter_pending())) == count
    assert table.pending == count


def test_requests_with_drawn_ids_applied_again_after_a_restart_count_each_timer_once(tmp_path) -> None:
    rig = new_rig(tmp_path / "worker")
    sources = _drawn_batches(rig, 50)
    # The step is in the table and the changelog, its progress record is not: the worker dies.
    rig.producer.hold_if = lambda sent: sent.key == PROGRESS_KEY
    asyncio.run(rig.engine.ingest(sources))
    _pending_is_exact(rig.table(0), 50)
    rig.close()

    restarted = Rig(rig.directory, rig.config)  # the same data dir
    assert restarted.table(0).request_offset < sources[-1].offset  # so its requests are read again
    restarted.ingest(*sources)
    _pending_is_exact(restarted.table(0), 50)
    restarted.tick(T + 1)
    assert len(restarted.fired()) == 50
    _pending_is_exact(restarted.table(0), 0)
    restarted.close()


def test_requests_with_drawn_ids_applied_again_by_a_new_owner_count_each_timer_once(tmp_path) -> None:
    rig = new_rig(tmp_path / "worker")
    sources = _drawn_batches(rig, 50)
    rig.producer.hold_if = lambda sent: sent.key == PROGRESS_KEY
    asyncio.run(rig.engine.ingest(sources))
    written = [s for s in rig.producer.sent if s.topic == rig.config.changelog_topic and s.delivered]
    rig.close()

    # Another worker rebuilds the table from the changelog, which ends with the step's records.
    owner = new_rig(tmp_path / "owner")
    owner.table(0).apply([(s.key or b"", s.value) for s in written], offset=len(written) - 1)
    _pending_is_exact(owner.table(0), 50)
    owner.ingest(*sources)
    _pending_is_exact(owner.table(0), 50)
    owner.close()


def test_an_id_drawn_again_after_its_timer_fired_is_still_found_by_a_cancel(rig: Rig) -> None:
    first, timer_id = _schedule(rig, T_MS + 500)
    rig.ingest(first)
    rig.tick(T + 1)
    assert rig.fired() == [timer_id]  # listed for the sweep, not swept yet
    # The same id comes again as new (a producer reusing what it drew), before the sweep.
    record, _ = build_schedule(
        COMMON, "orders", "k", b"v", now=rig.now / 1000, at=(T_MS + 5_500) / 1000, id=timer_id
    )
    again = rig.raw_request(record.key, record.value, (*record.headers, (IDS_HEADER, IDS_NEW)))
    rig.ingest(again)
    _pending_is_exact(rig.table(0), 1)
    asyncio.run(rig.sweep())

    rig.ingest(rig.cancel(timer_id))
    assert [e.id for e in rig.events(Kind.CANCELLED)] == [timer_id]
    assert rig.events(Kind.CANCEL_MISSED) == []
    _pending_is_exact(rig.table(0), 0)
    rig.tick(T + 6)
    assert rig.fired() == [timer_id]  # once, the first time
