"""Each request is applied once per (topic, partition), with several ingress topics feeding one table.

The changelog carries, per partition, the last applied offset of every ingress
topic: `timer-request`'s in the closing ``m:progress`` record (as before there
were other topics), the others' in ``m:progress:<topic>`` records written before it.
That record lands while the next step runs (:mod:`futures.worker.progress`): nothing
more is written to its partition's changelog until it has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.table import (
    APPLYING_PREFIX,
    PROGRESS_KEY,
    TOPIC_PROGRESS_PREFIX,
    PartitionTimers,
    progress_record,
    table_key,
)
from ktimers.config import CommonConfig, IngressFormat, TopicsConfig
from ktimers.errors import DeliveryError
from ktimers.wire import Future, FutureBatch
from tests.worker.fakes import Sent, permanent_error
from tests.worker.rig import T_MS, Rig, T

ETF1 = "schedules"


def etf1_headers(due_s: int) -> tuple[tuple[str, bytes | None], ...]:
    return (
        ("scheduler-epoch", str(due_s).encode()),
        ("scheduler-target-topic", b"orders"),
        ("scheduler-target-key", b"k"),
    )


class FormatsRig(Rig):
    def schedule_etf1(self, key: str, due_s: int, partition: int = 0) -> SourceRecord:
        return self._record(ETF1, partition, key.encode(), key.encode(), etf1_headers(due_s))

    def etf1_without_epoch(self, key: str, due_s: int, partition: int = 0) -> SourceRecord:
        return self._record(ETF1, partition, key.encode(), b"x", etf1_headers(due_s)[1:])

    def batch(self, *ids: str, due_ms: int, partition: int = 0) -> SourceRecord:
        futures = [Future(callBackTopic="orders", callBackKey=i, id=i, due_ms=due_ms) for i in ids]
        value = FutureBatch(futures=futures).SerializeToString()
        return self._record(self.topics.request, partition, None, value, (("kt-kind", b"batch"),))


@pytest.fixture
def make(tmp_path: Path):
    rigs: list[FormatsRig] = []

    def build(**settings: object) -> FormatsRig:
        topics = TopicsConfig(ingress=((ETF1, IngressFormat.ETF1),))
        config = WorkerConfig(common=CommonConfig(topics=topics), **settings)  # type: ignore[arg-type]
        rig = FormatsRig(tmp_path / f"rig{len(rigs)}", config)
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        rig.close()


def skipped(rig: Rig) -> float:
    return rig.metrics.requests_skipped._value.get()


def test_the_same_offset_on_two_topics_is_two_requests(make):
    rig = make()
    native, etf1 = rig.request("native", T_MS + 500), rig.schedule_etf1("vid", T + 1)
    assert native.offset == etf1.offset == 0
    rig.ingest(native, etf1)
    assert sorted(rig.pending_ids()) == ["native", f"{ETF1}:vid"]
    assert skipped(rig) == 0
    assert (rig.table(0).request_offset, rig.table(0).topic_offset(ETF1)) == (0, 0)


def test_records_read_again_are_skipped_per_topic_also_after_a_rebuild(make):
    rig = make()
    old_native, old_etf1 = rig.request("a", T_MS + 500), rig.schedule_etf1("a", T)
    rig.ingest(old_native, old_etf1)
    rig.tick(T + 1)
    assert sorted(rig.fired()) == ["a", f"{ETF1}:a"]
    # A new owner resumes both topics from older committed offsets.
    rig.ingest(old_etf1, old_native, rig.schedule_etf1("b", T + 2), rig.request("b", T_MS + 2000))
    rig.tick(T + 2)
    assert sorted(rig.fired()) == ["a", "b", f"{ETF1}:a", f"{ETF1}:b"]
    assert skipped(rig) == 2

    rebuilt = PartitionTimers(rig.directory / "rebuilt.db")
    try:
        rebuilt.apply([(s.key or b"", s.value) for s in rig.changelog(0)], offset=None)
        assert rebuilt.request_offset == 1
        assert rebuilt.topic_offsets == {ETF1: 1}
    finally:
        rebuilt.close()


def test_topic_progress_follows_the_records_it_covers_and_m_progress_closes_each_write(make):
    rig = make()
    rig.ingest(rig.schedule_etf1("x", T + 5), rig.schedule_etf1("y", T + 6), rig.request("n", T_MS + 7000))
    rig.ingest(rig.schedule_etf1("z", T + 8))
    # A write is everything up to and including its closing m:progress (flushed on its own).
    writes: list[list[tuple[bytes | None, bytes | None]]] = [[]]
    for sent in rig.changelog(0):
        writes[-1].append((sent.key, sent.value))
        if sent.key == PROGRESS_KEY:
            writes.append([])
    first, second, rest = writes
    assert rest == []
    # Each topic's step end comes before its timers: a table holding them knows it may.
    assert [key for key, _ in first[:-2]] == [
        APPLYING_PREFIX + ETF1.encode(),
        *(key for key, _ in first[1:3]),
        APPLYING_PREFIX + rig.topics.request.encode(),
        first[4][0],
    ]
    assert [key[:1] for key in (first[1][0], first[2][0], first[4][0])] == [b"t", b"t", b"t"]
    assert first[5:] == [
        (TOPIC_PROGRESS_PREFIX + ETF1.encode(), (1).to_bytes(8, "big")),
        progress_record(-1, 0),
    ]
    assert second[-2:] == [
        (TOPIC_PROGRESS_PREFIX + ETF1.encode(), (2).to_bytes(8, "big")),
        progress_record(-1, 0),
    ]


def test_a_table_written_before_other_topics_existed_still_loads(make, tmp_path):
    # Only the single progress record of the original layout: its offset is timer-request's.
    path = tmp_path / "old.db"
    old = PartitionTimers(path)
    future = Future(callBackTopic="orders", id="kept", due_ms=T_MS + 9000).SerializeToString()
    old.apply([(table_key(T_MS + 9000, "kept"), future), (PROGRESS_KEY, progress_record(T, 41)[1])], offset=7)
    old.close()

    reopened = PartitionTimers(path)
    try:
        assert (reopened.watermark, reopened.request_offset, reopened.topic_offsets) == (T, 41, {})
        assert reopened.topic_offset(ETF1) == -1  # nothing of the new topic applied yet
        assert [d.timer_id for d in reopened.iter_pending()] == ["kept"]
    finally:
        reopened.close()

    rig = make()
    rig.tables[0] = PartitionTimers(path)
    rig._offsets[(rig.topics.request, 0)] = 41  # timer-request is read again from offset 41
    replayed, new = rig.request("replayed", T_MS + 9500), rig.request("new", T_MS + 9600)
    rig.ingest(rig.schedule_etf1("first", T + 20), replayed, new)
    assert sorted(rig.pending_ids()) == ["kept", "new", f"{ETF1}:first"]
    assert skipped(rig) == 1  # offset 41 was applied before the upgrade
    assert (rig.table(0).request_offset, rig.table(0).topic_offset(ETF1)) == (42, 0)


def test_topic_offsets_only_move_forward_and_survive_a_reopen(tmp_path):
    path = tmp_path / "t.db"
    table = PartitionTimers(path)
    key = TOPIC_PROGRESS_PREFIX + b"schedules"
    table.apply([(key, (9).to_bytes(8, "big")), (key, (4).to_bytes(8, "big"))], offset=0)
    table.apply([(key, (6).to_bytes(8, "big"))], offset=1)
    assert table.topic_offset("schedules") == 9
    table.close()
    reopened = PartitionTimers(path)
    assert reopened.topic_offsets == {"schedules": 9}
    reopened.close()


def test_a_batch_record_is_applied_once_with_every_timer(make):
    rig = make()
    record = rig.batch("b1", "b2", "b3", due_ms=T_MS + 1000)
    rig.ingest(record)
    rig.ingest(record)  # read again after a restart
    assert rig.pending_ids() == ["b1", "b2", "b3"]
    assert skipped(rig) == 1
    rig.tick(T + 1)
    assert rig.fired() == ["b1", "b2", "b3"]


def test_a_large_ingest_is_made_durable_in_steps_covering_whole_records(make):
    rig = make(fire_chunk_size=4)
    records = [rig.batch(f"r{i}a", f"r{i}b", f"r{i}c", due_ms=T_MS + 1000) for i in range(4)]
    rig.ingest(*records)
    assert rig.table(0).pending == 12
    # Each step ends on a record boundary: its progress names the last whole record it applied.
    tails = [s for s in rig.changelog(0) if s.key == PROGRESS_KEY]
    assert [request_offset_of(s.value) for s in tails] == [1, 3]


def request_offset_of(value: bytes | None) -> int:
    """The `timer-request` offset in an ``m:progress`` value (watermark, offset; 8 bytes each)."""
    return int.from_bytes((value or b"")[8:16], "big", signed=True)


def test_a_step_cut_short_after_its_first_records_reached_the_changelog_is_put_right_when_read_again(
    make, monkeypatch
):
    # An ingest step produces its changelog records while it is still staging the rest, so a
    # crash in the middle of a step leaves some in the changelog with no progress record after.
    rig = make()
    first = [rig.batch(f"a{i}", f"b{i}", due_ms=T_MS + 5000) for i in range(3)]
    last = rig.cancel("a0")
    ingest = rig.engine._ingest

    def crash(*args: object) -> None:
        raise RuntimeError("the worker died here")

    monkeypatch.setattr(ingest, "_stage_parsed", crash)
    with pytest.raises(RuntimeError, match="died"):
        rig.ingest(*first, last)
    rig.producer.flush()  # what was produced reaches the broker, the worker dead or not
    written = rig.changelog(0)
    assert sorted(s.key for s in written) == sorted(
        [APPLYING_PREFIX + rig.topics.request.encode()]
        + [table_key(T_MS + 5000, f"{x}{i}") for x in "ab" for i in range(3)]
    )
    assert rig.table(0).pending == 0  # the local table took nothing of the step

    # The next owner rebuilds the table from the changelog, then reads the step's requests again.
    monkeypatch.undo()
    again = make()
    again.tables[0] = PartitionTimers(again.directory / "rebuilt.db")
    again.table(0).apply([(s.key or b"", s.value) for s in written], offset=None)
    again.ingest(*first, last)
    assert sorted(again.pending_ids()) == ["a1", "a2", "b0", "b1", "b2"]
    assert again.table(0).pending == 5
    assert again.table(0).request_offset == last.offset
    again.tick(T + 5)
    assert sorted(again.fired()) == ["a1", "a2", "b0", "b1", "b2"]


def _progress_of(rig: Rig, partition: int) -> Callable[[Sent], bool]:
    """Whether a record is ``partition``'s progress record (for ``FakeProducer.hold_if``)."""

    def held(sent: Sent) -> bool:
        return (
            sent.topic == rig.config.changelog_topic
            and sent.key == PROGRESS_KEY
            and sent.partition == partition
        )

    return held


def test_nothing_more_reaches_a_partitions_changelog_until_its_progress_record_landed(make):
    rig = make()
    rig.ingest(rig.request("fired", T_MS - 500), rig.request("other", T_MS - 500, partition=1))
    rig.producer.hold_if = _progress_of(rig, 0)  # the broker has not acknowledged it yet
    rig.now = T_MS + 10

    async def scenario() -> None:
        rig.engine.note_ticks([rig.tick_record(T, 0), rig.tick_record(T, 1)])
        await rig.engine.fire_ready()  # the firing task goes on: it does not wait for the record
        assert sorted(rig.fired()) == ["fired", "other"]
        assert rig.table(0).watermark == T  # moved in memory, with the timer deleted
        assert rig.pending_ids() == []
        step = asyncio.ensure_future(rig.engine.ingest([rig.request("next", T_MS + 9000)]))
        await asyncio.sleep(0.05)
        assert not step.done()
        changelog = rig.config.changelog_topic
        produced = [s.key for s in rig.producer.sent if s.topic == changelog and s.partition == 0]
        assert produced[-1] == PROGRESS_KEY  # nothing produced after it yet
        rig.producer.hold_if = lambda sent: False
        await step
        await rig.engine.landed()

    asyncio.run(scenario())
    keys = [s.key for s in rig.changelog(0)]
    tail = len(keys) - 1 - keys[::-1].index(PROGRESS_KEY)  # the ingest step's own
    assert keys.index(table_key(T_MS + 9000, "next")) == tail - 1  # after the firing's progress
    assert sorted(rig.pending_ids()) == ["next"]
    assert rig.table(1).persisted_offset == rig.changelog(1)[-1].offset


def test_a_restart_before_a_progress_record_landed_reads_its_requests_again_and_fires_once(make):
    rig = make()
    rig.ingest(rig.request("early", T_MS + 1000))
    landed = rig.table(0).persisted_offset
    rig.producer.hold_if = _progress_of(rig, 0)
    late = rig.request("late", T_MS + 2000)

    async def step_then_die() -> None:
        step = asyncio.ensure_future(rig.engine.ingest([late]))
        await asyncio.sleep(0.05)
        assert rig.pending_ids() == ["early", "late"]  # applied here, its progress on its way
        step.cancel()  # the worker dies: the progress record never lands

    asyncio.run(step_then_die())
    rig.tables.pop(0).close()
    written = [s for s in rig.changelog(0) if s.delivered]

    restarted = make()
    restarted.tables[0] = PartitionTimers(rig.directory / "p0.db")  # the table left on disk
    table = restarted.table(0)
    assert table.persisted_offset == landed
    assert table.request_offset < late.offset  # so the request is read again
    # Faust's recovery replays the changelog past the offset the table recorded.
    table.apply([(s.key or b"", s.value) for s in written if (s.offset or 0) > (landed or -1)], offset=None)
    restarted.ingest(late)
    assert restarted.pending_ids() == ["early", "late"]
    assert table.pending == 2
    restarted.tick(T + 2)
    assert restarted.fired() == ["early", "late"]


def test_a_restart_before_a_dead_letter_landed_reads_its_record_again(make):
    """A refused record of another ingress topic is acknowledged only once its dead letter is."""
    rig = make()
    bad = rig.etf1_without_epoch("no-epoch", T + 5)
    rig.producer.hold_if = lambda sent: sent.topic == rig.topics.dlq  # the letter is on its way

    async def step_then_die() -> None:
        step = asyncio.ensure_future(rig.engine.ingest([bad]))
        await asyncio.sleep(0.05)
        assert not step.done()
        step.cancel()  # the worker dies before the letter landed

    asyncio.run(step_then_die())
    assert rig.dlq() == []
    rebuilt = PartitionTimers(rig.directory / "rebuilt.db")
    try:
        rebuilt.apply([(s.key or b"", s.value) for s in rig.changelog(0)], offset=None)
        assert rebuilt.topic_offset(ETF1) < bad.offset  # so a restart reads the record again
    finally:
        rebuilt.close()

    restarted = make()
    restarted.ingest(bad)
    [letter] = restarted.dlq()
    assert (letter.key, letter.header("kt-reason")) == (b"no-epoch", b"missing-header")
    assert restarted.table(0).topic_offset(ETF1) == bad.offset


def test_a_progress_record_that_failed_to_land_stops_the_next_write_to_its_partition(make):
    rig = make()
    rig.ingest(rig.request("fired", T_MS - 500))
    rig.producer.hold_if = _progress_of(rig, 0)
    rig.now = T_MS + 10

    async def scenario() -> None:
        rig.engine.note_ticks([rig.tick_record(T)])
        await rig.engine.fire_ready()
        rig.producer.fail = lambda topic: permanent_error() if topic == rig.config.changelog_topic else None
        rig.producer.hold_if = lambda sent: False
        with pytest.raises(DeliveryError, match="progress"):
            await rig.engine.ingest([rig.request("next", T_MS + 9000)])

    asyncio.run(scenario())
    assert not any(s.key == table_key(T_MS + 9000, "next") for s in rig.changelog(0))


def test_a_table_is_current_as_of_the_last_progress_record_it_saw_land(tmp_path: Path) -> None:
    # Only its owner writes the partition: once a progress record landed, the table holds every
    # record of it, and a restart reuses it while no tombstone written since can have expired.
    rig = Rig(tmp_path, WorkerConfig())
    try:
        rig.ingest(rig.request("a", T_MS + 60_000))
        rig.now = T_MS + 5_000
        rig.tick(T + 5)
        assert rig.table(0).current_ms == T_MS + 5_010
        path = rig.table(0).path
    finally:
        rig.close()
    reopened = PartitionTimers(path)
    try:
        assert reopened.current_ms == T_MS + 5_010
    finally:
        reopened.close()
