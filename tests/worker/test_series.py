"""Recurring timers in the engine: each occurrence fires, the next is armed in the same write."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import wall_clock_ms
from futures.worker.table import PartitionTimers, table_key
from ktimers.config import CommonConfig, KafkaConfig
from ktimers.errors import DeliveryError
from ktimers.recurrence import H_OCCURRENCE
from ktimers.timers_pb2 import Recurrence
from ktimers.wire import KIND_BATCH, KIND_HEADER, Future, FutureBatch, StoredTimer
from tests.worker.fakes import permanent_error
from tests.worker.rig import T_MS, Kind, Rig, T
from tests.worker.test_precise import WallClockRig


def series(rig: Rig, timer_id: str, due_ms: int, recurrence: Recurrence, partition: int = 0) -> SourceRecord:
    future = Future(
        callBackTopic="orders",
        callBackKey=f"key-{timer_id}",
        callBack=timer_id.encode(),
        id=timer_id,
        due_ms=due_ms,
        recurrence=recurrence,
    )
    return rig.raw_request(timer_id.encode(), future.SerializeToString(), partition=partition)


def occurrences(rig: Rig) -> list[tuple[int, int]]:
    """(ordinal, due ms) of each callback, in the order they were sent."""
    return [(int(cb.header(H_OCCURRENCE) or 0), int(cb.header("kt-due-ms") or 0)) for cb in rig.callbacks()]


def test_an_interval_series_fires_each_occurrence_with_its_ordinal_and_ends_at_max_count(rig: Rig) -> None:
    rig.ingest(series(rig, "every", T_MS + 200, Recurrence(interval_ms=1000, max_count=3)))
    for second in range(T + 1, T + 6):
        rig.tick(second)
    assert occurrences(rig) == [(1, T_MS + 200), (2, T_MS + 1200), (3, T_MS + 2200)]
    assert rig.pending_ids() == []
    assert rig.table(0).pending == 0
    # The callback is the request's, with kt-occurrence after the user's headers and before kt-id.
    first = rig.callbacks()[0]
    assert first.header_names() == [H_OCCURRENCE, "kt-id", "kt-due-ms", "kt-fired-ms"]
    # Each next occurrence is a SCHEDULED event naming its due time, ordinal and the original request.
    armed = [e for e in rig.events(Kind.SCHEDULED)]
    assert [(e.due_ms, e.reason) for e in armed] == [
        (T_MS + 200, ""),
        (T_MS + 1200, "occurrence 2"),
        (T_MS + 2200, "occurrence 3"),
    ]
    assert {e.source_offset for e in armed} == {0}


def test_the_next_occurrence_is_armed_in_the_write_that_removes_the_current_one(rig: Rig) -> None:
    rig.ingest(series(rig, "s", T_MS + 500, Recurrence(interval_ms=60_000)))
    written = len(rig.changelog())
    rig.tick(T + 1)
    fire_write = rig.changelog()[written:]
    put = next(s for s in fire_write if (s.key or b"").startswith(b"t"))
    deleted = [(key, record) for key, record in rig.deletions() if record in fire_write]
    assert put.key == table_key(T_MS + 60_500, "s")
    assert [key for key, _ in deleted] == [table_key(T_MS + 500, "s")]
    deleting = deleted[0][1]
    # The next occurrence first (a cut write keeps it), in the same flush as the deletion.
    assert fire_write.index(put) < fire_write.index(deleting)
    assert put.flush_no == deleting.flush_no
    stored = StoredTimer.FromString(put.value or b"")
    assert (stored.future.recurrence.ordinal, stored.future.recurrence.first_due_ms) == (2, T_MS + 500)
    assert stored.source_offset == 0  # the request that started the series
    assert rig.table(0).due_of("s") == T_MS + 60_500
    assert rig.table(0).pending == 1


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut-between-put-and-tombstone"])
def test_a_table_rebuilt_from_the_changelog_holds_the_series_next_occurrence(rig: Rig, cut: bool) -> None:
    rig.ingest(series(rig, "s", T_MS + 500, Recurrence(interval_ms=1000)))
    rig.tick(T + 1)
    records = [(s.key or b"", s.value) for s in rig.changelog(0)]
    if cut:  # the write's last batches lost: its tombstone and progress record
        last_put = max(i for i, (key, value) in enumerate(records) if key.startswith(b"t") and value)
        records = records[: last_put + 1]
    rebuilt = PartitionTimers(rig.directory / "rebuilt.db")
    try:
        for record in records:  # one record per replay batch: the put and tombstone apart
            rebuilt.apply([record], offset=None)
        pending = [d.due_ms for d in rebuilt.iter_pending()]
        # Cut, the occurrence is still there to fire again (at least once), the next armed beside it.
        assert pending == ([T_MS + 500, T_MS + 1500] if cut else [T_MS + 1500])
        assert rebuilt.due_of("s") == T_MS + 1500  # a cancel by id finds the series
    finally:
        rebuilt.close()


def test_a_crash_before_the_write_repeats_the_occurrence_and_arms_the_next_once(rig: Rig) -> None:
    rig.ingest(series(rig, "s", T_MS + 500, Recurrence(interval_ms=1000)))
    changelog = rig.config.changelog_topic
    rig.producer.fail = lambda topic: permanent_error() if topic == changelog else None
    rig.now = (T + 1) * 1000 + 10
    with pytest.raises(DeliveryError):
        asyncio.run(rig.fire([rig.tick_record(T + 1)]))
    rig.producer.fail = lambda topic: None
    rig.tick(T + 1)  # the restarted worker fires the occurrence again, then arms the next
    rig.tick(T + 2)
    assert occurrences(rig) == [(1, T_MS + 500), (1, T_MS + 500), (2, T_MS + 1500)]
    assert [d.due_ms for d in rig.table(0).iter_pending()] == [T_MS + 2500]


def test_cancel_by_id_ends_the_series_and_a_new_version_replaces_it(rig: Rig) -> None:
    rig.ingest(
        series(rig, "c", T_MS + 100, Recurrence(interval_ms=1000)),
        series(rig, "r", T_MS + 100, Recurrence(interval_ms=1000)),
    )
    rig.tick(T + 1)
    rig.ingest(rig.cancel("c"), series(rig, "r", T_MS + 3300, Recurrence(interval_ms=5000, max_count=1)))
    for second in range(T + 2, T + 10):
        rig.tick(second)
    assert rig.fired() == ["c", "r", "r"]
    assert [(e.id, e.due_ms) for e in rig.events(Kind.CANCELLED)] == [("c", T_MS + 1100)]
    assert int(rig.callbacks()[2].header(H_OCCURRENCE) or 0) == 1  # the new series starts over
    assert rig.pending_ids() == []


def test_occurrences_missed_while_ticks_stopped_are_skipped(rig: Rig) -> None:
    rig.ingest(series(rig, "s", T_MS + 100, Recurrence(interval_ms=1000)))
    rig.tick(T + 10)  # ten seconds without ticks: the pending occurrence fires once, late
    rig.tick(T + 11)
    assert occurrences(rig) == [(1, T_MS + 100), (2, T_MS + 10_100)]


def test_a_series_goes_on_after_an_occurrence_is_dead_lettered(rig: Rig) -> None:
    rig.ingest(series(rig, "s", T_MS + 100, Recurrence(interval_ms=1000, max_count=2)))
    rig.producer.fail = lambda topic: permanent_error() if topic == "orders" else None
    rig.tick(T + 1)
    rig.producer.fail = lambda topic: None
    rig.tick(T + 2)
    assert [s.header("kt-reason") for s in rig.dlq()] == [b"callback-undeliverable"]
    assert occurrences(rig)[-1] == (2, T_MS + 1100)
    assert rig.pending_ids() == []


def test_a_cron_series_fires_on_its_minutes(rig: Rig) -> None:
    minute = (T_MS // 60_000 + 1) * 60_000
    rig.ingest(series(rig, "m", minute, Recurrence(cron="*/2 * * * *", time_zone="Europe/Paris")))
    rig.tick(minute // 1000)
    rig.tick(minute // 1000 + 1)
    assert [d.due_ms for d in rig.table(0).iter_pending()] == [minute + 120_000 - minute % 120_000]


@pytest.mark.parametrize(
    ("recurrence", "says"),
    [
        (Recurrence(cron="0 9 * *"), b"has 4 fields"),
        (Recurrence(cron="0 9 * * *", time_zone="Europe/Atlantis"), b"unknown time zone"),
        (Recurrence(interval_ms=500), b"shortest interval"),
        (Recurrence(interval_ms=1000, until_ms=T_MS), b"before the first due time"),
        # Counted up as it fires, in a 64-bit field: refused before it could overflow there.
        (Recurrence(interval_ms=1000, ordinal=2**63 - 1), b"the largest is"),
    ],
)
def test_an_invalid_recurrence_is_dead_lettered_with_its_reason(
    rig: Rig, recurrence: Recurrence, says: bytes
) -> None:
    rig.ingest(series(rig, "bad", T_MS + 100, recurrence), rig.request("good", T_MS + 100))
    [dead] = rig.dlq()
    assert dead.header("kt-reason") == b"invalid-recurrence"
    assert says in (dead.header("kt-error") or b"")
    assert rig.pending_ids() == ["good"]
    assert [e.id for e in rig.events(Kind.REJECTED)] == ["bad"]


def test_an_invalid_recurrence_in_a_batch_is_dead_lettered_alone(rig: Rig) -> None:
    bad = Future(callBackTopic="orders", id="bad", due_ms=T_MS, recurrence=Recurrence(cron="nope"))
    good = Future(callBackTopic="orders", id="good", due_ms=T_MS)
    value = FutureBatch(futures=[bad, good]).SerializeToString()
    rig.ingest(rig.raw_request(None, value, ((KIND_HEADER, KIND_BATCH),)))
    [dead] = rig.dlq()
    assert dead.key == b"bad"
    assert Future.FromString(dead.value or b"").id == "bad"
    assert rig.pending_ids() == ["good"]


def test_precise_mode_sends_each_occurrence_at_its_millisecond_and_a_cancel_ends_the_series(
    tmp_path: Path,
) -> None:
    rig = WallClockRig(tmp_path, WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True))
    engine = rig.engine

    async def scenario() -> None:
        while wall_clock_ms() % 1000 > 100:
            await asyncio.sleep(0.01)
        s = wall_clock_ms() // 1000
        await engine.ingest([series(rig, "p", s * 1000 + 400, Recurrence(interval_ms=1000))])
        await rig.fire([rig.tick_record(s)])
        for second in (s + 1, s + 2):
            await asyncio.sleep(max((second * 1000 + 20) - wall_clock_ms(), 0) / 1000)
            await rig.fire([rig.tick_record(second)])
        await asyncio.sleep(max((s + 2) * 1000 + 450 - wall_clock_ms(), 0) / 1000)
        await engine.ingest([rig.cancel("p")])  # the third occurrence was just sent
        await asyncio.sleep(max((s + 4) * 1000 + 20 - wall_clock_ms(), 0) / 1000)
        await rig.fire([rig.tick_record(s + 3)])
        await rig.fire([rig.tick_record(s + 4)])
        got = occurrences(rig)
        assert [ordinal for ordinal, _ in got] == [1, 2, 3]
        for cb, (_, due) in zip(rig.callbacks(), got, strict=True):
            fired = int(cb.header("kt-fired-ms") or 0)
            assert 0 <= fired - due < 250, f"{fired - due} ms late"
        assert [e.id for e in rig.events(Kind.CANCELLED)] == ["p"]
        assert rig.pending_ids() == []

    try:
        asyncio.run(scenario())
    finally:
        rig.close()
