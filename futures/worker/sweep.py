"""The sweep: each fired timer's own tombstone, written after its firing, when no tick waits.

A firing deletes its timers with ``f`` records that list thousands of them each
(:meth:`~futures.worker.table.PartitionTimers.fired_records`): one produce where a
tombstone per timer would cost a produce and a delivery report each, on the path
between a tick and its callbacks. Replayed, an ``f`` record deletes the same timers, so
recovery gives the same table. But a compacted changelog keeps each key's last
record, so every fired timer's put would stay in it, and come back on a replay that
starts past its ``f`` record's deletion: the sweep writes each listed timer's
tombstone, then the ``f`` record's own, in one changelog write, a bounded number at a
time (:meth:`Sweep.step`, run by :meth:`TimerEngine.run` when no tick waits, and cut short
when one comes: the next step goes on where it stopped).

A timer put again under the same key since it fired (the same id due at the same
time) gets no tombstone: it is pending, and its put comes after the ``f`` record in the
changelog. The tombstones change nothing in the table (the timers are gone), so they
are written to the changelog only; the ``f`` record's tombstone removes it from the table,
and with it the id index entries its timers left (see :mod:`futures.worker.table`): read
first where the id may have been put again since, unread where the table knows it was not
(:meth:`~futures.worker.table.PartitionTimers.trust_listings`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from futures.worker.changelog import Ahead, Changes, commit
from futures.worker.context import EngineContext
from futures.worker.table import PartitionTimers

#: Fired timers a step tombstones at most: a step holds the engine lock through its changelog
#: write, so a tick that comes meanwhile waits for it.
STEP_KEYS = 5000
#: Listed timers read and tombstoned between two chances for the event loop to run: precise
#: windows send without the engine lock, and a step read in one go would hold back every callback
#: due meanwhile (docs/PERFORMANCE.md#sweeping-a-fired-timer).
SLICE_KEYS = 250


@dataclass(frozen=True)
class _Stopped:
    """Where a step cut short stopped in a partition: in ``fired_key`` of ``table``, after ``at``
    of the keys it lists."""

    table: PartitionTimers
    fired_key: bytes
    at: int


class Sweep:
    def __init__(self, ctx: EngineContext) -> None:
        self._ctx = ctx
        #: Partitions whose tables may hold ``f`` records: every partition the worker fires.
        self._partitions: set[int] = set()
        #: Where steps cut short stopped, by partition. The partition's next step goes on from
        #: there: what is swept has lost its index entries, and an id among them put again since
        #: has not been noted (the lookup found no entry), so sweeping it again trusting the
        #: listings would take the new entry for stale. Only in the same table, owned all along:
        #: ``f`` keys are numbered from the highest the table holds, so another owner, or this
        #: table rebuilt, may have written another record under the same key (:meth:`revoke`).
        self._stopped: dict[int, _Stopped] = {}

    def note(self, partitions: Iterable[int]) -> None:
        """``partitions`` fire now (or may hold ``f`` records from before a restart). Under the
        engine lock, before the firing."""
        partitions = list(partitions)
        self._partitions.update(partitions)
        if not self._ctx.config.precise:
            # A firing holds the engine lock from its scan to its write: the index entries of
            # what it lists need no reading (PartitionTimers.trust_listings).
            for partition in partitions:
                self._ctx.tables(partition).trust_listings()

    def revoke(self, partitions: Iterable[int]) -> None:
        """``partitions`` went elsewhere (a rebalance): another owner may sweep and write under the
        keys of their ``f`` records before they come back, so a step cut short in one of them
        starts its record again, reading the index entries of every timer it lists
        (:meth:`~futures.worker.table.PartitionTimers.end_trust`), as a table that never swept it.
        Without the engine lock: a step under way stops sweeping them at its next slice."""
        for partition in partitions:
            stopped = self._stopped.pop(partition, None)
            if stopped is not None:
                stopped.table.end_trust()

    async def step(self, max_keys: int = STEP_KEYS, give_way: Callable[[], bool] | None = None) -> bool:
        """Tombstone up to about ``max_keys`` swept timers and their ``f`` records; whether more are left.

        Each timer's tombstone is produced as its slice is read (:class:`Ahead`), before its
        record's, which the write's :func:`commit` produces with the id index entries to delete.
        ``give_way``: asked before each slice; once it says True (a tick waits for the engine
        lock), the step reads no more and writes what it has, so a tick waits for at most a
        slice and the write, not a whole step.
        """
        ctx = self._ctx
        if not self._partitions:
            return False  # every table swept since the last tick: the engine lock is not taken
        # The tombstones are produced before the step's commit, so after the partitions' last
        # progress records: waited for before the lock, and again under it for a firing's since.
        await ctx.progress.landed(self._partitions)
        async with ctx.lock:
            await ctx.progress.landed(self._partitions)
            changes: dict[int, Changes] = {}
            ahead = Ahead()
            left = max_keys
            for partition in sorted(self._partitions):
                if left <= 0:
                    break
                if not ctx.owns(partition):
                    self._partitions.discard(partition)  # its new owner sweeps it
                    continue
                table = ctx.tables(partition)
                listings = table.fired_listings(left)
                if not listings:
                    self._partitions.discard(partition)
                    continue
                part = changes[partition] = Changes()
                for fired_key, listed in listings:
                    at = self._resumed(partition, table, fired_key)
                    while at < len(listed):
                        if not ctx.owns(partition):
                            table.end_trust()  # revoked meanwhile: no resume point (see revoke)
                            break
                        if give_way is not None and give_way():
                            self._stopped[partition] = _Stopped(table, fired_key, at)
                            await commit(ctx, changes, ahead=ahead)
                            return True
                        unswept = table.unswept(listed[at : at + SLICE_KEYS], fired_key)
                        ahead.tombstones(ctx, partition, unswept.gone)
                        part.stale_index.extend(unswept.stale_index)
                        at += SLICE_KEYS
                        left -= SLICE_KEYS
                        await asyncio.sleep(0)
                    if at < len(listed):
                        break
                    part.records.append((fired_key, None))
            if changes:
                await commit(ctx, changes, ahead=ahead)
            return left <= 0

    def _resumed(self, partition: int, table: PartitionTimers, fired_key: bytes) -> int:
        """How many of the keys ``fired_key`` (``partition``'s oldest ``f`` record left in
        ``table``) lists a step cut short tombstoned already."""
        stopped = self._stopped.pop(partition, None)
        # Another record (the one it stopped in was swept since), or another table under the
        # partition (reopened, rebuilt): this one from the start.
        if stopped is None or stopped.table is not table or stopped.fired_key != fired_key:
            return 0
        return stopped.at
