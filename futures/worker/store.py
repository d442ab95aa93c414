"""The timer table as a Faust store: one :class:`PartitionTimers` per changelog partition.

Faust owns what it is good at — assigning partitions co-partitioned with
``timer-request`` and ``oscillator``, and replaying the changelog into the store
when a partition arrives (``apply_changelog_batch``) — while the engine writes
through :meth:`TimerStore.partition` in bulk, bypassing Faust's one-record-at-a-time
``Table.__setitem__`` path (a Table update per event caps a worker's rate:
docs/PERFORMANCE.md#the-worker-is-one-python-process-on-one-core).

Registered as the Faust store ``timers://local`` through the ``faust.stores`` entry point.

A worker restarted on its data dir opens the tables it finds there while its
consumer waits for the group to answer its join (:meth:`TimerStore.open_found`,
in a thread), instead of after the assignment: opening RocksDB replays what the
dead process left in its write-ahead log, which otherwise stood between the
assignment and the first timer fired again.

A table is a cache of its changelog partition, and kept only while it can be caught up
exactly (:meth:`TimerStore.on_rebalance`): the table of a partition assigned elsewhere is
deleted (its next owner writes tombstones this table would need, and they expire); a table
found in the data dir, or handed straight back by a rebalance, is reused only if it was current
recently enough for the changelog to still hold every tombstone written since
(:class:`~futures.worker.changelog_topic.TableReuse`), and rebuilt from offset 0 otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from faust.types import TP, EventT

from futures.worker.changelog_topic import DEFAULT_REUSE, TableReuse
from futures.worker.faust_adapter import StoreBase
from futures.worker.fencing import OwnerFence, missed_a_generation
from futures.worker.restate import replayed
from futures.worker.table import PartitionTimers, Record
from ktimers.errors import TimersError

log = logging.getLogger(__name__)

#: A partition's table directory under the store's directory.
_TABLE_DIR = re.compile(r"partition-(\d+)\.db")
#: How long after the store starts :meth:`TimerStore.open_found` begins (seconds).
#: Opening a RocksDB table holds the GIL (docs/PERFORMANCE.md#10-m-pending), which would
#: hold back the consumer thread's JoinGroup, sent a few ms after the store starts;
#: Tansu then holds that join for 3 s, half the session timeout, while the tables open.
OPEN_FOUND_AFTER_S = 0.25


def _ignore(partitions: set[int]) -> None:
    pass


async def _nothing_to_settle() -> None:
    pass


async def _own_nothing(partitions: set[int], epoch: int) -> None:
    pass


class TableDiverged(TimersError):
    """A table holds writes of its own that a newer owner fenced: it is rebuilt on restart."""


def _check(fence: OwnerFence, table: PartitionTimers, partition: int, offset: int) -> None:
    """Say what ``fence`` skipped of the records a replay applied up to ``offset``; a table that holds
    writes of its own the replay skipped is marked for a rebuild, and the worker stops."""
    if fence.fenced:
        log.warning(
            "partition %d: skipped %d changelog records a revoked owner wrote after its successor "
            "started (up to offset %d)", partition, fence.fenced, offset,
        )  # fmt: skip
        fence.fenced = 0
    if fence.diverged:
        table.mark_stale()
        raise TableDiverged(
            f"partition {partition}: this worker's table holds changelog writes of its own that a newer "
            "owner fenced (it went on writing after losing the partition); the table is marked for a "
            "rebuild from the changelog, which the restart does"
        )


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _age(table: PartitionTimers, now_ms: int) -> str:
    if table.current_ms is None:
        return "never known current"
    return f"last current {(now_ms - table.current_ms) / 3_600_000:.1f} h ago"


class TimerStore(StoreBase):
    """Faust store backed by per-partition RocksDB timer tables."""

    def __init__(self, url: Any, app: Any, table: Any, **kwargs: Any) -> None:
        super().__init__(url, app, table, **kwargs)
        self._partitions: dict[int, PartitionTimers] = {}
        self._owned: set[int] = set()
        #: The `timer-request` topic (its progress is ``PartitionTimers.request_offset``).
        self.request_topic = ""
        #: True once the assigned partitions are recovered; False during a rebalance.
        self.ready = False
        #: Held by the engine while it mutates tables; a rebalance takes it before
        #: closing a revoked partition, so no write is cut in half.
        self.lock = asyncio.Lock()
        #: Tables :meth:`open_found` opened before the assignment, not yet handed over.
        self._found: dict[int, PartitionTimers] = {}
        #: Held while a table is opened: never two RocksDB handles on one directory.
        self._opening = threading.Lock()
        self._opening_found: asyncio.Future[list[int]] | None = None
        #: Set once :meth:`open_found` began: from then on it is waited for, never cancelled.
        self._found_began = False
        #: Set at the assignment: :meth:`open_found` stops after the table it is opening.
        self._found_enough = False
        #: Told the partitions :meth:`revoke` took away (the engine stops sending theirs).
        self.on_revoked: Callable[[set[int]], None] = _ignore
        #: Awaited once they are told, before the group rejoins and before the tables close:
        #: the engine settles what it sent of them (:meth:`settle_revoked`).
        self.on_settle: Callable[[], Awaitable[None]] = _nothing_to_settle
        #: Awaited at each assignment, under the lock, before recovery: the engine writes the
        #: partitions' owner records for the generation (:mod:`futures.worker.fencing`).
        self.on_assigned: Callable[[set[int], int], Awaitable[None]] = _own_nothing
        #: Per assigned partition, what its recovery applies of the changelog.
        self._fences: dict[int, OwnerFence] = {}
        #: The changelog partitions of this process's last assignment (its tables kept open since).
        self._assigned: set[int] = set()
        #: How old a table may be and still be caught up from the changelog: set by the worker
        #: from the changelog's settings (:func:`~futures.worker.changelog_topic.check_changelog`).
        self.reuse: TableReuse = DEFAULT_REUSE
        #: Reads the changelog's settings again, while :attr:`reuse` is not settled (the changelog
        #: was not created yet when the worker started, or its settings were unreadable).
        self.recheck: Callable[[], TableReuse] | None = None
        self._rechecking: asyncio.Task[None] | None = None
        #: Wall-clock epoch ms.
        self.clock: Callable[[], int] = _wall_clock_ms

    # -- what the engine uses -------------------------------------------------

    @property
    def directory(self) -> Path:
        return Path(self.app.conf.tabledir) / self.table_name

    def partition(self, partition: int) -> PartitionTimers:
        """The timer table of ``partition``, opened on first use."""
        timers = self._partitions.get(partition)
        if timers is None:
            with self._opening:
                timers = self._found.pop(partition, None)
                if timers is None:
                    timers = self._new_table(partition)
            self._partitions[partition] = timers
        return timers

    def _new_table(self, partition: int) -> PartitionTimers:
        """``partition``'s table as the data dir holds it, or a new one: empty, it holds every
        record it needs until its recovery from offset 0 passes the first (current now)."""
        path = self._table_path(partition)
        created = not path.exists()
        timers = PartitionTimers(path)
        if timers.stale:
            log.warning("%s: the table was marked for a rebuild: rebuilding it from the changelog", path)
            timers.destroy()
            timers, created = PartitionTimers(path), True
        if created:
            timers.mark_current(self.clock())
        return timers

    def _table_path(self, partition: int) -> Path:
        return self.directory / f"partition-{partition}.db"

    async def open_found(self) -> list[int]:
        """Open, in a thread, the tables of every partition found in the data dir; their partitions.

        What this worker held before it restarted: opening them while its
        consumer waits for the group, rather than once they are assigned again,
        takes RocksDB's recovery of a killed process's write-ahead log off the
        path to the first timer fired. At the assignment (:meth:`on_rebalance`), tables
        not assigned again are deleted, and those too old to catch up rebuilt. A table that
        fails to open here is opened again when assigned, where the error stops the worker.
        """
        self._found_began = True
        return await asyncio.to_thread(self._open, self._on_disk())

    def _on_disk(self) -> list[int]:
        """The partitions whose tables are in the data dir."""
        found = (_TABLE_DIR.fullmatch(p.name) for p in self.directory.glob("partition-*.db"))
        return sorted(int(m.group(1)) for m in found if m is not None)

    def _open(self, partitions: list[int]) -> list[int]:
        opened = []
        for partition in partitions:
            with self._opening:
                if self._found_enough or self.should_stop:
                    break
                if partition in self._partitions or partition in self._found:
                    continue
                try:
                    self._found[partition] = self._new_table(partition)
                except Exception as exc:  # noqa: BLE001 - retried on assignment, where it is fatal
                    log.warning("could not open the timer table of partition %d early: %r", partition, exc)
                    continue
            opened.append(partition)
        return opened

    async def _adopt_found(self) -> None:
        """Wait for :meth:`open_found` started with the store; its tables become the store's.

        If it has not begun (the assignment came first: a broker that answers a
        join at once), it is called off; if it has, it stops after the table it
        is opening (many partitions in the data dir would otherwise keep the
        assignment waiting). Tables it did not open are opened when first used.
        """
        if self._opening_found is not None:
            opening, self._opening_found = self._opening_found, None
            called_off = not self._found_began
            self._found_enough = True
            if called_off:
                opening.cancel()
            try:
                partitions = await opening
            except asyncio.CancelledError:
                if not called_off:
                    raise  # we were cancelled ourselves
            except Exception as exc:  # noqa: BLE001 - only a restart's speed depends on it
                log.warning("opening the tables found in the data dir failed: %r", exc)
            else:
                if partitions:
                    log.info("opened the timer tables of partitions %s found in the data dir", partitions)
        with self._opening:
            found, self._found = self._found, {}
        for partition, timers in found.items():
            if self._partitions.setdefault(partition, timers) is not timers:
                timers.close()  # cannot happen (both open under _opening); never leak a handle

    def open_partitions(self) -> dict[int, PartitionTimers]:
        """The tables of the partitions assigned here.

        Faust also asks for the persisted offset of partitions it does not
        assign us, which opens their tables: those are stale and not ours to
        report (readiness, the pending-timers gauge).
        """
        return {p: t for p, t in self._partitions.items() if p in self._owned}

    def resume_positions(self, assignment: set[TP]) -> dict[TP, int]:
        """Where to read each assigned ingress partition from: just past the last applied record.

        ``request_topic`` is set by :func:`futures.worker.app.create_app`; other
        ingress topics are known from the progress records they left.
        """
        positions: dict[TP, int] = {}
        for tp in assignment:
            if tp.partition not in self._owned:
                continue
            table = self.partition(tp.partition)
            if tp.topic == self.request_topic:
                last = table.request_offset
            elif tp.topic in table.topic_offsets:
                last = table.topic_offsets[tp.topic]
            else:
                continue
            if last >= 0:
                positions[tp] = last + 1
        return positions

    def owns(self, partition: int) -> bool:
        """Whether this worker is assigned ``partition`` now (records of others are not ours to apply)."""
        return partition in self._owned

    def revoke(self, revoked: Iterable[TP]) -> None:
        """Partitions go elsewhere: from now on they are not ours, and :attr:`on_revoked` is told.

        Called as soon as Faust reports a revocation (``PromptTableManager.on_partitions_revoked``),
        before the group rejoins, so before a new owner can fire their timers. Without the
        lock: the step in progress must not send on. Their tables stay until the
        assignment (:meth:`on_rebalance`), which may hand them straight back.
        """
        changelog = self.table.changelog_topic.topics
        self._give_up({tp.partition for tp in revoked if tp.topic in changelog})

    def _give_up(self, partitions: set[int]) -> None:
        partitions &= self._owned
        if partitions:
            log.info("partitions %s revoked: nothing of them is sent from now on", sorted(partitions))
            self._owned = self._owned - partitions
            self.on_revoked(partitions)

    async def settle_revoked(self) -> None:
        """What the engine sent of the revoked partitions is settled (written to the changelog,
        deleted here), or given up on: called after :meth:`revoke` and before the group rejoins
        (the app's ``on_partitions_revoked`` signal, which Faust awaits), so a partition's new
        owner, rebuilding its table from the changelog, does not send it again."""
        await self.on_settle()

    # -- Faust's recovery protocol -------------------------------------------

    async def on_start(self) -> None:
        await super().on_start()
        log.info("timer tables: %s", self.reuse)  # here: the worker's logging is set up by now
        # Started with the worker, once its consumer sent its JoinGroup (see open_found).
        self._opening_found = asyncio.ensure_future(self._open_found_soon())

    async def _open_found_soon(self) -> list[int]:
        await asyncio.sleep(OPEN_FOUND_AFTER_S)
        return await self.open_found()

    def persisted_offset(self, tp: TP) -> int | None:
        return self.partition(tp.partition).persisted_offset

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        self.partition(tp.partition).set_persisted_offset(offset)

    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        records: dict[int, list[Record]] = defaultdict(list)
        offsets: dict[int, int] = {}
        for event in batch:
            message = event.message
            partition = message.partition
            offsets[partition] = max(message.offset, offsets.get(partition, -1))
            if message.key is None:
                continue  # not ours: every record the engine writes has a key
            fence = self._fences.get(partition)
            if fence is None:
                table = self.partition(partition)
                fence = self._fences[partition] = OwnerFence(table.owner_epoch, table.written_epoch)
            headers = message.headers
            pairs = headers.items() if isinstance(headers, Mapping) else headers
            if not replayed(fence, self.partition(partition), message.key, pairs):
                continue  # written by an owner after a newer one had started
            records[partition].append((message.key, message.value))
        for partition, offset in offsets.items():
            table = self.partition(partition)
            fence = self._fences.get(partition)
            table.apply(
                records.get(partition, []), offset, owner_epoch=None if fence is None else fence.epoch
            )
            if fence is not None:
                _check(fence, table, partition, offset)

    async def on_rebalance(
        self,
        assigned: set[TP],
        revoked: set[TP],
        newly_assigned: set[TP],
        generation_id: int = 0,
    ) -> None:
        self.ready = False
        changelog = self.table.changelog_topic.topics
        await self._adopt_found()
        async with self.lock:
            kept = self._assigned & {tp.partition for tp in assigned if tp.topic in changelog}
            self._owned = {tp.partition for tp in assigned if tp.topic in changelog}
            self._assigned = set(self._owned)
            # Delete what went elsewhere (also tables Faust opened only to read their persisted
            # offset): its next owner writes tombstones that expire before it could come back.
            # A partition revoked and handed straight back, as the eager protocol does, keeps
            # its table, if it was current recently enough (a worker whose session expired
            # unnoticed had it taken away meanwhile).
            for partition in set(self._partitions) - self._owned:
                log.info("deleting the timer table of partition %d: assigned elsewhere", partition)
                self._partitions.pop(partition).destroy()
            # And those found in the data dir that open_found did not get to (none opens them now).
            for partition in set(self._on_disk()) - self._owned:
                log.info(
                    "deleting the timer table of partition %d found in the data dir: assigned elsewhere",
                    partition,
                )
                shutil.rmtree(self._table_path(partition), ignore_errors=True)
            now = self.clock()
            for partition in sorted(self._owned):
                timers = self.partition(partition)
                if partition in kept and missed_a_generation(timers.written_epoch, generation_id):
                    log.warning(
                        "rebuilding the timer table of partition %d from the changelog: this worker "
                        "was out of the group after generation %d (generation %d now), and another "
                        "owner may have written meanwhile", partition, timers.written_epoch, generation_id,
                    )  # fmt: skip
                elif not self.reuse.reusable(timers.current_ms, now):
                    log.info(
                        "rebuilding the timer table of partition %d from the changelog: %s (reused "
                        "within %.1f h)", partition, _age(timers, now), self.reuse.max_age_ms / 3_600_000,
                    )  # fmt: skip
                else:
                    continue
                timers.destroy()
                del self._partitions[partition]
                self.partition(partition)
            fences = {}
            for partition in self._owned:
                table = self.partition(partition)
                fences[partition] = OwnerFence(table.owner_epoch, table.written_epoch)
            self._fences = fences
            if self._owned:
                await self.on_assigned(set(self._owned), generation_id)
        self._recheck_soon()

    def _recheck_soon(self) -> None:
        """Read the changelog's settings again in the background, if they are not settled: what
        the next rebalance judges the tables kept through it by (those found at start, judged at
        the first, stay judged by what was known then)."""
        if self.reuse.settled or self.recheck is None:
            return
        if self._rechecking is None or self._rechecking.done():
            self._rechecking = asyncio.ensure_future(self._recheck(self.recheck))

    async def _recheck(self, recheck: Callable[[], TableReuse]) -> None:
        try:
            reuse = await asyncio.to_thread(recheck)
        except Exception as exc:  # noqa: BLE001 - tables are rebuilt meanwhile; asked again next time
            log.warning("could not read the changelog's settings again: %s", exc)
            return
        if reuse.settled:
            log.info("timer tables: %s", reuse)
        self.reuse = reuse

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        parts = sorted(tp.partition for tp in active_tps)
        now = self.clock()
        for partition in self._owned.intersection(parts):
            self.partition(partition).mark_current(now)  # read to the changelog's end
        pending = sum(self.partition(p).pending for p in parts)
        self.ready = True
        log.info("timer table ready: partitions %s, %d pending timers", parts, pending)

    async def backup_partition(
        self, tp: TP | int, flush: bool = True, purge: bool = False, keep: int = 1
    ) -> None:
        raise NotImplementedError("the changelog is the backup: a lost table is rebuilt from it")

    def restore_backup(self, tp: TP | int, latest: bool = True, backup_id: int = 0) -> None:
        raise NotImplementedError("the changelog is the backup: a lost table is rebuilt from it")

    def reset_state(self) -> None:
        with self._opening:
            found, self._found = self._found, {}
        for timers in [*self._partitions.values(), *found.values()]:
            timers.destroy()
        self._partitions.clear()

    async def stop(self) -> None:
        # Faust stops tables before agents: the engine settles what it sent (Faust revoked the
        # assignment already, unless the consumer never started), the step in progress ends,
        # and this owns nothing afterwards, so no later step touches a closed table.
        await self._adopt_found()
        self._give_up(set(self._owned))
        await self.settle_revoked()
        async with self.lock:
            self._owned = set()
            for timers in self._partitions.values():
                timers.close()
            self._partitions.clear()
        if self._rechecking is not None:
            self._rechecking.cancel()
        await super().stop()

    # -- the generic mapping interface (tools, web views): decoded timer keys --

    def raw_get(self, key: bytes) -> bytes | None:
        for timers in self._partitions.values():
            value = timers.get_raw(key)
            if value is not None:
                return value
        return None

    def raw_set(self, key: bytes, value: bytes | None) -> None:
        raise NotImplementedError("timers are written in bulk by the engine, not item by item")

    def raw_del(self, key: bytes) -> None:
        raise NotImplementedError("timers are deleted in bulk by the engine, not item by item")

    def raw_keys(self) -> Iterator[bytes]:
        for key, _ in self.raw_items():
            yield key

    def raw_values(self) -> Iterator[bytes | None]:
        for _, value in self.raw_items():
            yield value

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        for timers in list(self._partitions.values()):
            for due in timers.iter_pending():
                yield due.key, due.value

    def raw_size(self) -> int:
        return sum(t.pending for t in self._partitions.values())

    def raw_contains(self, key: bytes) -> bool:
        return self.raw_get(key) is not None

    def raw_clear(self) -> None:
        raise NotImplementedError("clearing the timer table would lose timers; use reset_state")
