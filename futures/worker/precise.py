"""Precise mode (``TIMERS_PRECISE=1``): each timer sent at its own millisecond.

On tick s of a partition the engine opens windows s + 1 and s + 2
(:meth:`PreciseMode.open`, bookkeeping in :mod:`futures.worker.windows`): each reads
its second's timers a second ahead, builds their callbacks, and sends each when this
worker's clock reaches its due millisecond — through the fire path's pieces:
``Dispatcher.callbacks`` to send, delivery reports to confirm
(``Dispatcher.confirm_reports``), and :func:`~futures.worker.changelog.commit` to settle
(the ``f`` record listing them, then the table), a few hundred timers at a time.

A window of second w (its timers due in ((w - 1) · 1000, w · 1000] ms) sends nothing before
the requests of its partition written before second w - 1 began are applied (the join's
frontier, :mod:`futures.worker.join`): it waits for them, as a tick does, at most
``TIMERS_JOIN_MAX_WAIT_S``. So a cancel or a new version written a whole second before the
second its timer is due in wins, however far behind the worker is; one written later races
with the send (once sent, a cancel reports ``CANCEL_MISSED``). Waiting for the requests
written up to each timer's own millisecond would put the ingest's latency (tens of
milliseconds, more under load) on every precise timer (docs/PERFORMANCE.md#lateness). It
sends nothing after its
partition is revoked, and settles what it sent before the group rejoins
(:meth:`~futures.worker.windows.Windows.settle_revoked`); a failed settle stops the worker
(``on_failure``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter

from futures.worker.callbacks import Callback
from futures.worker.changelog import Changes, commit
from futures.worker.context import EngineContext, callback_bytes, piece_count
from futures.worker.join import RequestFrontier
from futures.worker.kafka import Deliveries
from futures.worker.series import arm_next
from futures.worker.table import due_of_key
from futures.worker.windows import FailFn, Window, Windows, callback_of, wake

log = logging.getLogger(__name__)

#: Timers a window reads and builds between two chances for the open windows to send: a read
#: stays short beside the millisecond a precise timer is due on (docs/PERFORMANCE.md#lateness).
_READ = 50
#: A window whose second did not fit in the budget reads on once it holds fewer timers than this,
#: up to _READ_AHEAD of them.
_READ_BELOW = 2000
_READ_AHEAD = 6000
#: A window settles what it sent every this many timers, or this share of its byte budget (or,
#: while its previous settle is writing, all it sent meanwhile once that one is done).
_SETTLE_EVERY = 500
_SETTLE_BUDGET_SHARE = 8
#: How long a window waits before it looks at the frontier again (s).
_FRONTIER_POLL_S = 0.005
#: How long a window that must read on waits before it tries again (ms).
_READ_POLL_MS = 1
#: Timers a window sends at most between two looks at its partition and this worker's clock.
_SEND_AT_ONCE = 500

_key = attrgetter("key")


class PreciseMode:
    def __init__(self, ctx: EngineContext, frontier: RequestFrontier, on_failure: FailFn) -> None:
        self._ctx = ctx
        self._frontier = frontier
        self.windows = Windows(ctx.budget.ahead, on_failure)
        self._on_failure = on_failure
        self._monotonic: Callable[[], float] = time.monotonic

    async def open(self, partition: int, second: int) -> None:
        """Open windows ``second + 1`` and ``second + 2`` where they are not open (under the lock,
        the watermark at ``second``): each is sending a second before its timers are due.

        The scan goes a few dozen timers at a time, letting the open windows send between:
        a second of 10 k timers takes tens of milliseconds to read, longer than a timer may wait.
        """
        ctx, windows = self._ctx, self.windows
        for second_ahead in (second + 1, second + 2):
            if not ctx.owns(partition):
                return  # revoked while the tick fired, or while the window before was read
            if windows.is_open(partition, second_ahead):
                continue
            window = windows.new(partition, second_ahead)
            while self._read(window) and not window.gauge.full():
                await asyncio.sleep(0)
            windows.open(window, self._send)

    def _read(self, window: Window) -> bool:
        """Read on into ``window`` from the table, a slice of its second's timers, as far as the
        budget has room; whether there may be more. A timer an ingest step has cancelled or
        replaced but not yet deleted is marked removed in its window already
        (:meth:`Windows.cancel`, :meth:`Windows.withdraw`), so this needs no lock: a read is
        one synchronous scan."""
        if window.complete or window.gauge.full():
            return not window.complete
        partition, second = window.partition, window.second
        room = window.gauge.max_bytes - window.gauge.used
        count = piece_count(_READ, room)
        due = self._ctx.tables(partition).due_items(
            second * 1000, count, after=window.cursor, from_ms=(second - 1) * 1000 + 1, max_bytes=room
        )
        held, removed = window.held, window.removed
        for key, value in due:
            # Offered since it was accepted (Windows.offer), maybe sent already; or cancelled or
            # replaced by a write still on its way to the table.
            if key in held or key in removed:
                continue
            callback = callback_of(key, partition, value)
            if callback is not None:  # else left in the table, for the tick to dead-letter
                window.add((due_of_key(key), key, callback))
        if due:
            window.cursor = due[-1][0]
        window.complete = len(due) < count and sum(len(v) for _, v in due) < room
        return not window.complete

    async def _read_on(self, window: Window) -> None:
        """Read ``window``'s timers on from the table while it holds few enough to send and the
        budget has room, a slice at a time, the windows sending between slices."""
        ctx = self._ctx
        while not window.complete and not window.closing:
            if not window.wants_reading(_READ_BELOW):
                await asyncio.sleep(_READ_POLL_MS / 1000)  # for its settles to free bytes
                continue
            while window.wants_reading(_READ_AHEAD):
                if window.closing or not ctx.owns(window.partition):
                    return
                self._read(window)
                if window.waiter is not None:
                    wake(window.waiter)
                await asyncio.sleep(0)

    def _load(self, partition: int, key: bytes) -> Callback | None:
        """The callback of the timer under ``key``, read from the table (for a deferred timer)."""
        stored = self._ctx.tables(partition).get_raw(key)
        return None if stored is None else callback_of(key, partition, stored)

    async def _send(self, window: Window) -> None:
        """Send each timer of ``window`` at its due millisecond, then delete what was sent.

        Runs without the lock while it waits, so ingest goes on: a timer accepted
        meanwhile joins (``Windows.offer``), one cancelled or replaced is skipped
        (``window.removed``). Never early: a timer is sent when this worker's clock
        has reached its due time. Never after its partition was revoked; what it sent by then
        it settles, unless abandoned (:meth:`Windows.settle_revoked`).
        A failure ends it with the failure, every settle's awaited first.
        """
        ctx = self._ctx
        end_ms = window.second * 1000
        partition = window.partition
        settle_bytes = max(window.gauge.max_bytes // _SETTLE_BUDGET_SHARE, 1)

        def load(key: bytes) -> Callback | None:
            return self._load(partition, key)

        # Sent timers are settled and deleted a few hundred at a time, beside the sending:
        # all at once at the end of the second, that work (tens of ms a thousand timers)
        # would hold up the next window's first timers. One settle at a time: each takes the
        # engine lock for a changelog write, and at 100 k timers a second a settle every 500
        # would queue on the lock ahead of ingest, the ticks and the window's own reading on.
        settling: list[asyncio.Task[None]] = []
        sent: list[Callback] = []
        sent_at: list[int] = []  # when each was sent (epoch ms)
        # The timers the budget had no room for when the window opened, read as it frees.
        reading = None if window.complete else asyncio.create_task(self._read_on(window))
        try:
            deliveries = Deliveries()
            sent_bytes = 0
            # The window's join point: the requests written before it must be applied first.
            join_ms, joined = (window.second - 2) * 1000, False
            waited_since: float | None = None  # monotonic seconds: when its first due timer waited
            while True:
                # Checked again before each timer, with no await until it is produced.
                if window.revoked or not ctx.owns(partition):
                    break
                next_due = window.next_due()
                if next_due is None and not window.complete:
                    await window.wait(_READ_POLL_MS / 1000)  # for _read_on to find more
                    continue
                now = ctx.clock()
                wait_ms = (end_ms if next_due is None else next_due) - now
                if wait_ms > 0:
                    await window.wait(wait_ms / 1000)  # an earlier timer offered meanwhile cuts it short
                    continue
                if next_due is None:
                    break  # the second is over: a timer offered from now on is the next tick's
                if not joined:
                    waited_since = self._monotonic() if waited_since is None else waited_since
                    joined = self._joined(partition, join_ms, waited_since)
                    if not joined:
                        await window.wait(_FRONTIER_POLL_S)
                        continue
                # Every timer due by now, in one go: a hot second has a hundred a millisecond.
                due = window.pop_due(now, load, _SEND_AT_ONCE)  # cancelled or replaced ones left out
                ctx.dispatch.renew_if_refused()
                ctx.dispatch.callbacks.put_all(due, str(now).encode(), deliveries, sent)
                sent_at.extend(repeat(now, len(due)))
                window.sent.update(map(_key, due))
                sent_bytes += sum(map(callback_bytes, due))
                if (len(sent) >= _SETTLE_EVERY or sent_bytes >= settle_bytes) and (
                    not settling or settling[-1].done()
                ):
                    settling.append(asyncio.create_task(self._settle(window, sent, sent_at, deliveries)))
                    deliveries, sent, sent_at, sent_bytes = Deliveries(), [], [], 0
            window.closing = True
            if sent and not window.abandoned:  # revoked too: what it sent is settled before the rejoin
                settling.append(asyncio.create_task(self._settle(window, sent, sent_at, deliveries)))
                sent = []
        finally:
            window.closing = True
            if reading is not None:
                reading.cancel()
            # Open until its timers are deleted: the tick of its second waits for that (Windows.done).
            settled = await asyncio.gather(*settling, return_exceptions=True)
            window.settled(sent)  # left in the table, for the new owner: at least once
            window.release()
            self.windows.close(window)
        for outcome in settled:
            if isinstance(outcome, BaseException):
                raise outcome  # to Windows' on_failure: the worker stops

    def _joined(self, partition: int, join_ms: int, since: float) -> bool:
        """Whether a window may send: the requests of ``partition`` written before ``join_ms``
        (epoch ms) are applied, or it has waited for them ``TIMERS_JOIN_MAX_WAIT_S`` since
        ``since`` (monotonic seconds; counted once). The frontier only moves on, so once
        joined a window stays joined."""
        frontier_ms = self._frontier.frontier_ms(partition)
        if frontier_ms is None or frontier_ms >= join_ms:
            return True
        if self._monotonic() - since >= self._ctx.config.join_max_wait_s:
            self._ctx.metrics.join_wait_bound.inc()
            return True
        return False

    async def _settle(
        self, window: Window, sent: list[Callback], sent_at: list[int], deliveries: Deliveries
    ) -> None:
        """Once their delivery reports are in, record a window's sent timers (``sent_at``: when
        each was sent) and delete them.

        A failure stops the worker at once (``on_failure``), before the window sends on.
        """
        ctx = self._ctx
        partition = window.partition
        try:
            await ctx.writer.delivered(deliveries)
            async with ctx.lock:
                if window.abandoned:
                    return  # the new owner sends them again: at least once
                outcome = ctx.dispatch.confirm_reports(sent, deliveries, sent_at)
                await ctx.dispatch.deliver_dead_letters(outcome)
                part = Changes()
                done = [(sent[i], sent_at[i]) for i in outcome.done if sent[i].key not in window.removed]
                # A series' next occurrence, in the same write and before the tombstone.
                armed = arm_next(ctx, done, {partition: part})
                part.fired.extend(callback.key for callback, _ in done)
                part.pending_delta -= len(done)
                # Transient failures stay in the table: the next tick's scan retries them.
                await commit(ctx, {partition: part})
                for offer in armed:
                    self.windows.offer(*offer)
        except Exception as exc:
            self._on_failure(exc)
            raise
        finally:
            window.settled(sent)
