"""The fire path: build → send → confirm → settle, for every timer that fires in second mode.

:meth:`Firing.fire` fires each partition's timers due by a target second and moves
its watermark there: a tick's second (:mod:`futures.worker.engine`), or the watermark where it
is for timers accepted already due (:mod:`futures.worker.ingest`). It never fires past
this worker's clock, whatever the target: a watermark inherited from another worker may be
ahead of ours.

All partitions' timers go out as one stream in due order, not one partition after
another: the timers a tick made latest go first, wherever they live. The stream goes in
pieces — a third of ``TIMERS_FIRE_CHUNK_SIZE`` timers, and a twelfth of
``TIMERS_FIRE_BUDGET_BYTES`` of stored timers (passed by one timer at most, read across the
partitions from one room) — overlapped: while one piece's callbacks
are on their way to the broker, the piece before is confirmed (delivery reports →
FIRED events, dead letters, retries) and the one before that settled (the ``f`` records
listing its timers written and the timers deleted, :func:`~futures.worker.changelog.commit`;
their own tombstones come later, :mod:`~futures.worker.sweep`). So what is
sent and not yet deleted — what a crash would send again — stays within
``TIMERS_FIRE_CHUNK_SIZE``, and what is sent and not yet confirmed stays within the
firing's share of the budget whatever the payloads the configuration admits (it refuses a
budget whose share cannot hold a piece and one timer of ``TIMERS_MAX_PAYLOAD_BYTES``): a
piece that would pass it waits for the one before to be confirmed.

A timer whose callback failed transiently stays in the table, and the watermark moves on:
the table's low mark (:attr:`~futures.worker.table.PartitionTimers.low_ms`) makes the
next firing of its partition read it again. That is the one retry there is. A timer whose
bytes in the table no callback can be built from (protobuf does not read them) is
dead-lettered and deleted alone (``unreadable-timer``); the rest of its firing goes on.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter

from futures.worker.callbacks import Callback, Item
from futures.worker.changelog import Changes, commit
from futures.worker.context import EngineContext, piece_count
from futures.worker.dispatch import FireOutcome, Sending
from futures.worker.fired_columns import keys_by_partition
from futures.worker.lookahead import Lookahead
from futures.worker.series import arm_next
from futures.worker.table import PartitionTimers

#: Timers of a firing's first piece at most: its first callbacks leave before a whole piece is read.
_FIRST_PIECE = 2000
#: Pieces in flight: one sent, one being confirmed, one being settled.
_DEPTH = 3

#: Clock moves that may join a firing under way: partition → second, of partitions other than those given.
Join = Callable[[Collection[int]], dict[int, int]]


class DueScan:
    """One partition's timers due by a limit, read from the table a piece at a time, in key (= due) order."""

    def __init__(self, partition: int, table: PartitionTimers, limit_ms: int) -> None:
        self.partition = partition
        self.limit_ms = limit_ms
        self._table = table
        self._items: list[tuple[bytes, bytes]] = []
        self.held = 0  # bytes of the stored timers in hand
        self.more = True  # the last read was full: the table may hold more due timers
        self.last = b""  # the last key read: the next read starts past it

    def read(self, count: int, max_bytes: int) -> int:
        """Read on, up to ``count`` due timers and ``max_bytes`` of them in hand (the last one
        read may pass it: its size is known once it is read); the bytes read.

        Topped up, not read only once all were taken: a piece is the timers up to the
        first partition's last key read, and the other partitions' leftovers alone
        would make a piece of a few dozen timers, each piece costing broker round trips.
        """
        want, room = count - len(self._items), max_bytes - self.held
        if want <= 0 or room <= 0 or not self.more:
            return 0
        want = piece_count(want, room)
        items = self._table.due_items(self.limit_ms, want, after=self.last or None, max_bytes=room)
        read = sum(map(len, map(_second, items)))
        self.more = len(items) == want or read >= room
        if items:
            self._items.extend(items)
            self.held += read
            self.last = items[-1][0]
        return read

    def take(self, bound: bytes | None) -> list[tuple[bytes, int, bytes]]:
        """The timers in hand with keys up to ``bound`` (all of them if None), as (key, partition, value)."""
        items = self._items
        end = len(items) if bound is None else bisect.bisect_right(items, bound, key=_first)
        taken, self._items = items[:end], items[end:]
        self.held -= sum(map(len, map(_second, taken)))
        # Built by zip, in C: this runs for every fired timer.
        return list(zip(map(_first, taken), repeat(self.partition), map(_second, taken)))


_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def _last_read(scan: DueScan) -> bytes:
    return scan.last


@dataclass
class Fired:
    """What a firing scanned, per partition: up to when (epoch ms), and the earliest timer it
    kept for a retry (due epoch ms); and the partitions revoked before their scan was done."""

    limits: dict[int, int] = field(default_factory=dict)
    kept: dict[int, int] = field(default_factory=dict)
    cut: set[int] = field(default_factory=set)


class Firing:
    def __init__(self, ctx: EngineContext, lookahead: Lookahead) -> None:
        self._ctx = ctx
        self._lookahead = lookahead

    async def fire(self, targets: dict[int, int], join: Join | None = None) -> dict[int, int]:
        """Fire each partition's timers due by its target second (epoch s), and move its
        watermark there; the watermarks moved (partition → second). Under the engine lock.

        ``join``: watermark moves that arrive meanwhile join the firing (second mode: one
        second's ticks of several partitions often come in two fetches).
        """
        ctx = self._ctx
        changes = {partition: Changes() for partition in targets}
        fired = await self._fire_due(targets, changes, join)
        for partition, target in targets.items():  # joined ticks were added to ``targets``
            # A partition revoked mid-firing keeps its watermark: what was not sent stays due, for
            # whoever owns it next, this worker too when an eager rebalance hands it straight back.
            if target > ctx.tables(partition).watermark and partition not in fired.cut:
                changes[partition].watermark = target
        await commit(ctx, changes)
        for partition, limit_ms in fired.limits.items():
            if partition not in fired.cut:
                ctx.tables(partition).scanned(limit_ms, fired.kept.get(partition))
        return {p: part.watermark for p, part in changes.items() if part.watermark is not None}

    def _scan(self, partition: int, second: int, fired: Fired) -> DueScan:
        ctx = self._ctx
        limit_ms = min(second * 1000, ctx.clock())
        fired.limits[partition] = limit_ms
        return DueScan(partition, ctx.tables(partition), limit_ms)

    async def _fire_due(
        self, targets: dict[int, int], changes: dict[int, Changes], join: Join | None
    ) -> Fired:
        ctx = self._ctx
        dispatch = ctx.dispatch
        depth = _DEPTH if ctx.config.fire_chunk_size >= _DEPTH else 1
        piece, piece_bytes = ctx.config.fire_chunk_size // depth, ctx.budget.piece
        fired = Fired()
        scans = [self._scan(partition, second, fired) for partition, second in targets.items()]
        flight: deque[tuple[Sending, int]] = deque()  # and the bytes of its stored timers
        unconfirmed = 0  # bytes of the timers in flight
        waiting: list[tuple[bytes, int, bytes]] = []  # a piece that waits for room in the share
        settling: asyncio.Task[None] | None = None
        size = min(piece, _FIRST_PIECE)
        try:
            while True:
                if not all(ctx.owns(scan.partition) for scan in scans):
                    # Revoked meanwhile (TimerEngine.revoke): nothing more of it is sent.
                    fired.cut.update(scan.partition for scan in scans if not ctx.owns(scan.partition))
                    scans = [scan for scan in scans if ctx.owns(scan.partition)]
                    waiting = [timer for timer in waiting if ctx.owns(timer[1])]
                if waiting:
                    batch, waiting = waiting, []
                else:
                    batch = self._next_piece(scans, size, piece_bytes)
                    size = piece
                if batch:
                    batch_bytes = sum(map(len, map(_third, batch)))
                    if flight and unconfirmed + batch_bytes > ctx.budget.firing:
                        # Large timers: what is sent and unconfirmed stays within the firing's
                        # share of the budget, so this piece waits for the oldest to be confirmed.
                        waiting = batch
                    else:
                        # Built as they go out, but for those built before the tick (Lookahead).
                        refused: list[Item] = []
                        sending = dispatch.send(self._lookahead.take(batch, refused), ctx.clock(), refused)
                        flight.append((sending, batch_bytes))
                        unconfirmed += batch_bytes
                        if len(flight) < depth - 1:
                            continue  # the next piece goes out before this one is confirmed
                if not flight:
                    return fired
                sending, sent_bytes = flight.popleft()
                unconfirmed -= sent_bytes
                outcome = await dispatch.confirm(sending)
                await dispatch.deliver_dead_letters(outcome)
                self._confirmed(outcome, sending.callbacks, changes, fired)
                if join is not None:
                    for partition, second in join(targets).items():
                        targets[partition] = second
                        changes[partition] = Changes()
                        scans.append(self._scan(partition, second, fired))
                if flight or waiting or any(scan.more for scan in scans):
                    # A large second: this piece is settled while the next go out (one settle
                    # at a time, in order); the last piece is the caller's, with the watermark move.
                    if settling is not None:
                        await settling
                    piece_changes = dict(changes)
                    for partition in changes:
                        changes[partition] = Changes()
                    settling = asyncio.ensure_future(commit(ctx, piece_changes))
                    if depth == 1:  # a firing too small to share: one piece at a time
                        await settling
                        settling = None
        finally:
            if settling is not None:
                await settling

    @staticmethod
    def _next_piece(scans: list[DueScan], count: int, max_bytes: int) -> list[tuple[bytes, int, bytes]]:
        """The next piece of the stream: at most about ``count`` timers and ``max_bytes`` of
        them read (and in hand) across ``scans``, as (key, partition, value) in due order.

        The scans read in turn from the room the others left, the one the merge waits for (its
        last key read is the lowest) first, each up to its share; none once the piece's bytes
        are in hand. So what a piece holds passes ``max_bytes`` by one timer at most, whatever
        the payloads and however many partitions fire.
        """
        share = max(len(scans), 1)
        in_hand = sum(scan.held for scan in scans)
        for scan in sorted(scans, key=_last_read):
            room = max_bytes - in_hand
            if room <= 0:
                break
            in_hand += scan.read(max(count // share, 1), min(max(max_bytes // share, 1), scan.held + room))
        # Past the first last-read key of a partition that may hold more, some
        # partition's timers are not in hand yet: they wait for the next piece.
        bound = min((scan.last for scan in scans if scan.more), default=None)
        # Each scan's run is in key order: Timsort merges them.
        batch = sorted(chain.from_iterable(scan.take(bound) for scan in scans))
        if not batch and in_hand >= max_bytes:
            # The piece's bytes are in hand, all past a partition that had no room left to read:
            # they go out now, a little out of order, rather than wait for room that never comes.
            batch = sorted(chain.from_iterable(scan.take(None) for scan in scans))
        return batch

    def _confirmed(
        self, outcome: FireOutcome, sent: list[Callback], changes: dict[int, Changes], fired: Fired
    ) -> None:
        """The timers delivered or dead-lettered are deleted (``Changes.fired``); those that failed
        transiently are kept."""
        done = sent if len(outcome.done) == len(sent) else [sent[i] for i in outcome.done]
        deleted, recurring = keys_by_partition(done)  # in compiled code
        # Recurring timers: the next occurrence, in the write that removes this one and before
        # its tombstone, so that no part of the write ends the series.
        arm_next(self._ctx, [(c, fired.limits[c.partition]) for c in recurring], changes)
        for partition, keys in deleted.items():
            changes[partition].fired.extend(keys)
            changes[partition].pending_delta -= len(keys)
        # Dead-lettered as they were stored: read again, they would be refused again.
        for key, partition, _ in outcome.refused:
            changes[partition].fired.append(key)
            changes[partition].pending_delta -= 1
        if outcome.transient:
            # Kept in the table: the scans here read on past them, the next firing reads them again.
            self._ctx.metrics.dispatch_retries.inc(len(outcome.transient))
            for i in outcome.transient:
                callback = sent[i]
                kept = fired.kept.get(callback.partition)
                if kept is None or callback.due_ms < kept:
                    fired.kept[callback.partition] = callback.due_ms
