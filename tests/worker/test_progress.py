"""Each request is applied once per (topic, partition), with several ingress topics feeding one table.

The changelog carries, per partition, the last applied offset of every ingress
topic: `timer-request`'s in the closing ``m:progress`` record (as before there
were other topics), the others' in ``m:progress:<topic>`` records written before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.table import (
    PROGRESS_KEY,
    TOPIC_PROGRESS_PREFIX,
    PartitionTimers,
    progress_record,
    table_key,
)
from ktimers.config import CommonConfig, IngressFormat, TopicsConfig
from ktimers.wire import Future, FutureBatch
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
    assert [key[:1] for key, _ in first[:3]] == [b"t", b"t", b"t"]
    assert first[3:] == [
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
        table_key(T_MS + 5000, f"{x}{i}") for x in "ab" for i in range(3)
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
