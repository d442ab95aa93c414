"""Where a worker resumes reading requests: from its table's progress, not Faust's commits."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from faust.types import TP

from futures.worker.app import create_app
from futures.worker.changelog_topic import TableReuse
from futures.worker.config import WorkerConfig
from futures.worker.table import PartitionTimers, progress_record
from futures.worker.transport import TimerConsumer


def test_resume_positions_follow_the_tables_progress(tmp_path: Path) -> None:
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    timers = create_app(config, partitions=4)
    store = timers.store
    request = config.common.topics.request
    changelog = config.changelog_topic
    assigned = {TP(changelog, 0), TP(changelog, 1), TP(request, 0), TP(request, 1), TP("oscillator", 0)}
    asyncio.run(store.on_rebalance(assigned, set(), assigned))

    # Partition 0 applied requests up to offset 41; partition 1 never applied one.
    store.partition(0).apply([progress_record(1_800_000_000, 41)], offset=7)
    store.partition(2).apply([progress_record(1_800_000_000, 99)], offset=3)  # not assigned here

    everything = assigned | {TP(request, 2)}
    assert store.resume_positions(everything) == {TP(request, 0): 42}
    store.reset_state()


def test_a_restarted_worker_opens_the_tables_it_finds_before_its_assignment(tmp_path: Path) -> None:
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    changelog = config.changelog_topic
    before = create_app(config, partitions=4).store
    held = {TP(changelog, p) for p in (0, 1, 2)}
    asyncio.run(before.on_rebalance(held, set(), held))
    for p in (0, 1, 2):
        before.partition(p).apply([progress_record(1_800_000_000, 40 + p)], offset=p)
    asyncio.run(before.stop())

    after = create_app(config, partitions=4).store

    async def restart() -> list[int]:
        found = await after.open_found()  # what the store starts while the consumer joins
        # Held open from now on: RocksDB refuses a second handle on the same table.
        with pytest.raises(Exception, match="lock"):
            PartitionTimers(after.directory / "partition-0.db")
        assigned = {TP(changelog, 0), TP(changelog, 1)}
        await after.on_rebalance(assigned, set(), assigned)
        return found

    assert asyncio.run(restart()) == [0, 1, 2]
    # The tables opened early are the ones the worker fires from, state intact...
    assert {p: t.request_offset for p, t in after.open_partitions().items()} == {0: 40, 1: 41}
    # ...and the one not assigned again was deleted at the assignment.
    assert not (after.directory / "partition-2.db").exists()
    asyncio.run(after.stop())


HOUR_MS = 3_600_000
NOW_MS = 1_800_000_000_000


def _config(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )


def test_the_table_of_a_partition_assigned_elsewhere_is_deleted_and_one_handed_straight_back_kept(
    tmp_path: Path,
) -> None:
    # Its next owner writes tombstones (timers fired, cancelled) that Kafka removes a day later:
    # a table kept until the partition came back would fire those timers again.
    config = _config(tmp_path)
    store = create_app(config, partitions=4).store
    changelog = config.changelog_topic
    both = {TP(changelog, 0), TP(changelog, 1)}
    asyncio.run(store.on_rebalance(both, set(), both))
    for p in (0, 1):
        store.partition(p).apply([progress_record(1_800_000_000, 40 + p)], offset=p)
    kept = store.partition(0)
    PartitionTimers(store.directory / "partition-3.db").close()  # found on disk, never opened

    asyncio.run(store.on_rebalance({TP(changelog, 0)}, both, set()))  # eager: all revoked, 0 back

    assert store.partition(0) is kept and kept.request_offset == 40
    assert not (store.directory / "partition-1.db").exists()
    assert not (store.directory / "partition-3.db").exists()
    asyncio.run(store.stop())


def test_a_table_found_in_the_data_dir_is_reused_only_if_it_was_current_within_the_changelogs_retention(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    changelog = config.changelog_topic
    before = create_app(config, partitions=4).store
    held = {TP(changelog, p) for p in (0, 1)}
    asyncio.run(before.on_rebalance(held, set(), held))
    for p in (0, 1):
        before.partition(p).apply([progress_record(1_800_000_000, 40 + p)], offset=p)
    before.partition(0).mark_current(NOW_MS - 2 * HOUR_MS)  # its last progress landed 2 h ago
    before.partition(1).mark_current(NOW_MS - 25 * HOUR_MS)  # a day and an hour ago
    asyncio.run(before.stop())
    # Written by a worker that did not record when it was current: nothing proves it is.
    unknown = PartitionTimers(before.directory / "partition-2.db")
    unknown.apply([progress_record(1_800_000_000, 42)], offset=2)
    assert unknown.current_ms is None
    unknown.close()
    held.add(TP(changelog, 2))

    after = create_app(config, partitions=4).store
    after.clock = lambda: NOW_MS
    after.reuse = TableReuse.after(24 * HOUR_MS)  # Kafka's default delete.retention.ms

    async def restart() -> None:
        await after.open_found()
        await after.on_rebalance(held, set(), held)

    asyncio.run(restart())
    tables = after.open_partitions()
    assert {p: t.request_offset for p, t in tables.items()} == {0: 40, 1: -1, 2: -1}
    # Rebuilt: Faust's recovery reads their changelog partitions from offset 0.
    assert {p: t.persisted_offset for p, t in tables.items()} == {0: 0, 1: None, 2: None}
    asyncio.run(after.stop())


def test_an_assignment_before_the_found_tables_are_opened_opens_them_when_used(tmp_path: Path) -> None:
    # A broker that answers the join at once: the worker does not wait to open what it found.
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    changelog = config.changelog_topic
    before = create_app(config, partitions=4).store
    asyncio.run(before.on_rebalance({TP(changelog, 0)}, set(), {TP(changelog, 0)}))
    before.partition(0).apply([progress_record(1_800_000_000, 40)], offset=0)
    asyncio.run(before.stop())
    after = create_app(config, partitions=4).store

    async def restart() -> None:
        await after.on_start()
        await after.on_rebalance({TP(changelog, 0)}, set(), {TP(changelog, 0)})

    asyncio.run(restart())
    assert {p: t.request_offset for p, t in after.open_partitions().items()} == {0: 40}
    asyncio.run(after.stop())


def test_a_revocation_takes_partitions_away_as_faust_reports_it(tmp_path: Path) -> None:
    # First thing of Faust's revocation, before the group rejoins: from then on nothing of them
    # is applied or sent here, though their tables stay open until the assignment.
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    timers = create_app(config, partitions=4)
    store = timers.store
    changelog, request = config.changelog_topic, config.common.topics.request
    assigned = {TP(changelog, 0), TP(changelog, 1), TP(request, 0), TP(request, 1)}
    asyncio.run(store.on_rebalance(assigned, set(), assigned))
    told: list[set[int]] = []
    store.on_revoked = told.append

    timers.app.tables.on_partitions_revoked({TP(changelog, 1), TP(request, 1)})

    assert told == [{1}]
    assert (store.owns(0), store.owns(1)) == (True, False)
    asyncio.run(store.stop())


def test_a_stopping_worker_settles_what_it_sent_before_its_tables_close(tmp_path: Path) -> None:
    # Faust stops the tables before the consumer leaves the group: the engine records what it
    # sent of every partition while their tables are still open, so the next owner does not send it.
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    timers = create_app(config, partitions=4)
    store = timers.store
    changelog = config.changelog_topic
    assigned = {TP(changelog, 0), TP(changelog, 1)}
    asyncio.run(store.on_rebalance(assigned, set(), assigned))
    table = store.partition(0)
    revoked: list[set[int]] = []
    store.on_revoked = revoked.append
    same_table: list[bool] = []

    async def settle() -> None:
        same_table.append(store.partition(0) is table)  # not closed yet, nor opened again
        table.apply([progress_record(1_800_000_000, 5)], offset=1)  # a settle's write

    store.on_settle = settle
    asyncio.run(store.stop())

    assert revoked == [{0, 1}]
    assert same_table == [True]
    reopened = PartitionTimers(store.directory / "partition-0.db")
    try:
        assert reopened.persisted_offset == 1
    finally:
        reopened.close()


class _ConsumerThread:
    """Stands in for Faust's consumer thread: it owns aiokafka's fetcher, so every seek must run on it."""

    def __init__(self, assignment: set[TP], committed: dict[TP, int]) -> None:
        self._assignment, self._committed = assignment, committed
        self.thread = threading.Thread(target=lambda: None)
        self.seeks: list[tuple[TP, int, threading.Thread]] = []

    def assignment(self) -> set[TP]:
        return self._assignment

    async def seek_to_committed(self) -> dict[TP, int]:
        return dict(self._committed)

    def seek(self, tp: TP, offset: int) -> None:  # aiokafka's seek, run on the caller's thread
        self.seeks.append((tp, offset, threading.current_thread()))

    async def seek_wait(self, partitions: dict[TP, int]) -> None:  # Faust runs it on its thread
        for tp, offset in partitions.items():
            self.seeks.append((tp, offset, self.thread))


def test_a_worker_resumes_past_its_committed_offsets_on_the_consumers_own_thread(tmp_path: Path) -> None:
    # A seek from the event loop's thread drops the partition's fetched records while the
    # consumer thread may be handing them out: the fetcher crashed with a KeyError on a takeover.
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    timers = create_app(config, partitions=4)
    request = config.common.topics.request
    assigned = {TP(config.changelog_topic, 0), TP(config.changelog_topic, 1), TP(request, 0), TP(request, 1)}
    asyncio.run(timers.store.on_rebalance(assigned, set(), assigned))
    timers.store.partition(0).apply([progress_record(1_800_000_000, 41)], offset=7)
    thread = _ConsumerThread(assigned, {TP(request, 0): 30, TP(request, 1): 5})
    consumer = timers.app.consumer
    assert isinstance(consumer, TimerConsumer)
    consumer._thread = thread  # type: ignore[assignment]

    positions = asyncio.run(consumer.seek_to_committed())

    assert positions[TP(request, 0)] == 42 and positions[TP(request, 1)] == 5
    assert thread.seeks == [(TP(request, 0), 42, thread.thread)]
    timers.store.reset_state()


def test_a_worker_started_before_its_changelog_existed_rebuilds_what_it_found_and_reads_the_settings_again(
    tmp_path: Path,
) -> None:
    # What it found caches a changelog that is gone; once Faust has created the new one, its
    # settings say how long a table kept through a rebalance can be caught up.
    config = _config(tmp_path)
    changelog = config.changelog_topic
    before = create_app(config, partitions=4).store
    held = {TP(changelog, 0)}
    asyncio.run(before.on_rebalance(held, set(), held))
    before.partition(0).apply([progress_record(1_800_000_000, 40)], offset=0)
    asyncio.run(before.stop())

    after = create_app(config, partitions=4).store
    after.reuse = TableReuse(0, "changelog t-timers-changelog: not created yet", settled=False)
    asked: list[int] = []

    def recheck() -> TableReuse:
        asked.append(1)
        return TableReuse.after(24 * HOUR_MS, "changelog t-timers-changelog: cleanup.policy=compact")

    after.recheck = recheck

    async def restart() -> tuple[int, int]:
        await after.open_found()
        await after.on_rebalance(held, set(), held)
        rebuilt = after.partition(0).request_offset
        assert after._rechecking is not None
        await after._rechecking
        after.partition(0).apply([progress_record(1_800_000_000, 50)], offset=0)
        after.partition(0).mark_current(after.clock())
        await after.on_rebalance(held, held, set())  # handed straight back
        return rebuilt, after.partition(0).request_offset

    assert asyncio.run(restart()) == (-1, 50)
    assert asked == [1] and after.reuse.settled
    asyncio.run(after.stop())
