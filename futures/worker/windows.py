"""Precise mode's bookkeeping: per partition, one window per coming second, sending its timers
each at its own millisecond.

Window ``k`` of a partition holds its timers due in ``((k - 1) · 1000, k · 1000]`` (epoch ms).
On tick s the engine opens windows s + 1 and s + 2 where they are not open yet, so a window
is running a second before its first timer is due: a tick that comes late (it waited behind
ingest, or in the broker) delays none of them. Timers accepted into an open window's second
after it opened join it (:meth:`Windows.offer`); a cancel or a new version takes its timer
out (:meth:`Windows.cancel`, :meth:`Windows.withdraw`). Timers stay in the table until sent
and deleted by their window (``PreciseMode._send``), so a crash re-sends them.
All open windows together hold at most their share of ``TIMERS_FIRE_BUDGET_BYTES``: a second
whose timers do not fit is read on from the table as its sent timers are settled and free
their bytes (``Window.cursor``), so each timer still goes out at its own millisecond.
A revoked partition's windows stop before their next timer (:meth:`Windows.revoke`) and settle
what they sent before the group rejoins (:meth:`Windows.settle_revoked`), and a window's
failure is reported at once (``on_failure``), never left in its task.
A window holds its timers' callbacks ready to send (:mod:`futures.worker.callbacks`): built
when it opens, a second ahead, not at each timer's millisecond. A timer whose bytes no
callback can be built from (:func:`callback_of`) is left in the table: the tick of its second
finds it and dead-letters it alone (:mod:`futures.worker.firing`).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
from collections.abc import Callable, Collection, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from futures.worker.callbacks import Callback
from futures.worker.context import callback_bytes
from futures.worker.prepare import prepare

#: A timer for a window: (due epoch ms, table key, its callback).
Item = tuple[int, bytes, Callback]


@dataclass
class Gauge:
    """Bytes of callbacks the open windows hold (taken, or sent and not yet settled), all
    partitions together, against the windows' share of ``TIMERS_FIRE_BUDGET_BYTES``."""

    max_bytes: int
    used: int = 0

    def full(self) -> bool:
        return self.used >= self.max_bytes


def callback_of(key: bytes, partition: int, stored: bytes) -> Callback | None:
    """The callback of the timer ``stored`` under ``key`` in ``partition``'s table; None if its
    bytes cannot be read (no window takes it: its tick's scan dead-letters it)."""
    try:
        return prepare(key, partition, stored)
    except DecodeError:
        return None


def window_of(due_ms: int) -> int:
    """The window (an epoch second) holding a timer due at ``due_ms``: the second it is due by."""
    return -(-due_ms // 1000)


@dataclass
class Window:
    """The timers of one partition due within one second, sent one by one as each comes due."""

    partition: int
    second: int  # holds the timers due in ((second - 1) · 1000, second · 1000]
    gauge: Gauge
    #: (due ms, table key) of the timers still to send, earliest first; their callbacks in ``callbacks``.
    heap: list[tuple[int, bytes]] = field(default_factory=list)
    callbacks: dict[bytes, Callback] = field(default_factory=dict)
    held: set[bytes] = field(default_factory=set)  # table keys of every timer it took
    sent: set[bytes] = field(default_factory=set)
    removed: set[bytes] = field(default_factory=set)  # cancelled or replaced by ingest meanwhile
    #: The table key of the last timer read for it, and whether the table holds no more of its
    #: second past it (timers accepted meanwhile are offered, and not read again).
    cursor: bytes | None = None
    complete: bool = False
    #: Table keys of timers it takes without their callback, offered while the budget was full:
    #: read from the table when their turn comes (:meth:`pop`).
    deferred: set[bytes] = field(default_factory=set)
    #: Set once the window sent its last timer: a timer offered later is left to the tick's scan.
    closing: bool = False
    #: Set when its partition is revoked: it sends nothing more, and settles what it sent
    #: (:meth:`Windows.settle_revoked`, before the group rejoins).
    revoked: bool = False
    #: Set when it may write nothing more (the worker stops on a failure, or its revoked
    #: partition's settle ran out of time): what it sent and did not settle stays in the table.
    abandoned: bool = False
    task: asyncio.Task[None] | None = None
    #: What the sending task is waiting on; an earlier timer offered meanwhile wakes it.
    waiter: asyncio.Future[None] | None = None

    def add(self, item: Item) -> bool:
        """Take a timer (a new version replaces a pending one of the same key); True if it
        is now the earliest to send."""
        due_ms, key, callback = item
        self._take(due_ms, key)
        self.callbacks[key] = callback
        self.gauge.used += callback_bytes(callback)
        return self.heap[0][1] == key

    def defer(self, due_ms: int, key: bytes) -> bool:
        """Take a timer without building its callback (the budget is full): :meth:`pop` reads it
        from the table. True if it is now the earliest to send."""
        self._take(due_ms, key)
        self.deferred.add(key)
        return self.heap[0][1] == key

    def _take(self, due_ms: int, key: bytes) -> None:
        old = self.callbacks.pop(key, None)
        if old is not None:
            self.gauge.used -= callback_bytes(old)
        elif key not in self.deferred:
            heapq.heappush(self.heap, (due_ms, key))
        self.deferred.discard(key)
        self.held.add(key)
        self.removed.discard(key)  # withdrawn for this very version: it is the one to send

    def next_due(self) -> int | None:
        """Due time (epoch ms) of the next timer to send, if any."""
        return self.heap[0][0] if self.heap else None

    def wants_reading(self, below: int) -> bool:
        """Whether it should read on from the table: it holds fewer than ``below`` timers to send,
        its second's table holds more, and the budget has room."""
        return not self.complete and len(self.heap) < below and not self.gauge.full()

    def pop(self, load: Callable[[bytes], Callback | None]) -> Callback | None:
        """The next timer's callback (``load``: read it from the table, for a deferred one), or
        None if it was cancelled, replaced or is gone. Its bytes stay counted until it is
        settled (:meth:`settled`)."""
        _, key = heapq.heappop(self.heap)
        callback = self.callbacks.pop(key, None)
        if callback is None:
            if key not in self.deferred:
                return None
            self.deferred.discard(key)
            if key in self.removed or (callback := load(key)) is None:
                return None
            self.gauge.used += callback_bytes(callback)
            return callback
        if key in self.removed:
            self.gauge.used -= callback_bytes(callback)
            return None
        return callback

    def pop_due(self, now_ms: int, load: Callable[[bytes], Callback | None], limit: int) -> list[Callback]:
        """The callbacks of the timers due by ``now_ms``, earliest first, at most ``limit`` of them
        (:meth:`pop` each: those cancelled, replaced or gone are left out)."""
        heap, pop = self.heap, self.pop
        due: list[Callback] = []
        while heap and heap[0][0] <= now_ms and len(due) < limit:
            callback = pop(load)
            if callback is not None:
                due.append(callback)
        return due

    def settled(self, callbacks: Iterable[Callback]) -> None:
        """``callbacks`` it sent are settled (or left to the table): their bytes are free."""
        self.gauge.used -= sum(callback_bytes(c) for c in callbacks)

    def release(self) -> None:
        """It sends no more: the bytes of the callbacks it still holds are free."""
        self.gauge.used -= sum(callback_bytes(c) for c in self.callbacks.values())
        self.callbacks.clear()
        self.deferred.clear()
        self.heap.clear()

    async def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if :meth:`Windows.offer` adds an earlier timer meanwhile."""
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        timer = loop.call_later(seconds, wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None


def wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


SendFn = Callable[[Window], Coroutine[Any, Any, None]]
FailFn = Callable[[BaseException], None]


class Windows:
    """The open windows, by partition and second."""

    def __init__(self, max_bytes: int, on_failure: FailFn) -> None:
        self._open: dict[tuple[int, int], Window] = {}
        #: Bytes all of them hold at most (half of ``TIMERS_FIRE_BUDGET_BYTES``).
        self.gauge = Gauge(max_bytes)
        #: Told of a window whose sending failed (its durable writes failed: the worker must stop).
        self._on_failure = on_failure
        #: Every window's task until it ends, revoked ones included: the loop keeps only weak references.
        self._tasks: set[asyncio.Task[None]] = set()
        #: Revoked windows still settling what they sent (:meth:`settle_revoked`).
        self._revoked: list[Window] = []

    def __bool__(self) -> bool:
        return bool(self._open)

    def is_open(self, partition: int, second: int) -> bool:
        return (partition, second) in self._open

    def partitions(self) -> set[int]:
        """The partitions with an open window."""
        return {partition for partition, _ in self._open}

    def new(self, partition: int, second: int) -> Window:
        """A window for :meth:`open`, to fill first."""
        return Window(partition, second, self.gauge)

    def open(self, window: Window, send: SendFn) -> None:
        """Run ``send(window)``; it must call :meth:`close` when done."""
        self._open[(window.partition, window.second)] = window
        task = window.task = asyncio.get_running_loop().create_task(send(window))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._ended, window))

    def _ended(self, window: Window, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.close(window)  # already, unless cancelled before it ran: a tick must not wait for it
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._on_failure(exc)

    def close(self, window: Window) -> None:
        if self._open.get((window.partition, window.second)) is window:
            del self._open[(window.partition, window.second)]

    def revoke(self, partitions: Collection[int]) -> None:
        """Stop the windows of ``partitions`` before their next timer.

        They leave the open windows at once (a tick no longer waits for them, a cancel or a
        new version no longer looks at them) and wake to end. What they sent they settle
        (:meth:`settle_revoked`); what they did not send stays in the table, for the
        partition's new owner.
        """
        for key, window in list(self._open.items()):
            if window.partition in partitions:
                del self._open[key]
                window.revoked = window.closing = True
                self._revoked.append(window)
                if window.waiter is not None:
                    wake(window.waiter)

    async def settle_revoked(self, timeout_s: float) -> bool:
        """Wait until the revoked windows have settled what they sent, at most ``timeout_s``;
        whether they all did. Those still settling then are abandoned: they write nothing
        more (a settle already writing completes: it holds the engine lock), and what they
        sent stays in the table, for the new owner to send again.

        Awaited before the group rejoins, so a partition's new owner, which rebuilds its
        table from the changelog, does not send again what this worker sent before the rebalance.
        """
        revoked, self._revoked = self._revoked, []
        tasks = [w.task for w in revoked if w.task is not None and not w.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        late = [w for w in revoked if w.task is not None and not w.task.done()]
        for window in late:
            window.abandoned = True
        return not late

    def abandon(self) -> None:
        """Every window, open or revoked, writes nothing more (the worker stops on a failure)."""
        for window in [*self._open.values(), *self._revoked]:
            window.abandoned = True
        self._revoked = []

    async def done(self, seconds: Mapping[int, int]) -> None:
        """Wait until the windows of each partition up to its second in ``seconds`` have sent
        and deleted their timers (the tick's scan must not find them).

        A window that failed does not raise here: its failure went to ``on_failure``.
        """
        waiting = [window.task for window in self._up_to(seconds) if window.task is not None]
        if waiting:
            await asyncio.wait(waiting)  # not cancelled with the caller: they stop on revocation

    def sending(self, seconds: Mapping[int, int]) -> bool:
        """Whether a window of a partition up to its second in ``seconds`` is still open."""
        return any(True for _ in self._up_to(seconds))

    def _up_to(self, seconds: Mapping[int, int]) -> Iterator[Window]:
        for (partition, second), window in list(self._open.items()):
            if second <= seconds.get(partition, -1):
                yield window

    def offer(self, partition: int, due_ms: int, key: bytes, stored: bytes) -> None:
        """A timer just accepted into the table (``stored``: its ``StoredTimer`` bytes): its window
        sends it, if that window is open and still sending; otherwise a tick's scan finds it."""
        window = self._open.get((partition, window_of(due_ms)))
        if window is None or window.closing or key in window.sent:
            return
        if self.gauge.full():
            earliest = window.defer(due_ms, key)
        else:
            callback = callback_of(key, partition, stored)
            if callback is None:
                return
            earliest = window.add((due_ms, key, callback))
        if earliest and window.waiter is not None:
            wake(window.waiter)

    def cancel(self, partition: int, due_ms: int, key: bytes) -> bool:
        """For a cancel: take the timer out of its window; True if it was sent already.

        Marked removed even if the window has not read it yet: a window reads on without
        the engine lock (``PreciseMode._read_on``), and may find it in the table before
        the cancel's write deletes it.
        """
        window = self._open.get((partition, window_of(due_ms)))
        if window is None:
            return False
        if key in window.sent:
            return True
        window.removed.add(key)
        return False

    def withdraw(self, partition: int, due_ms: int, key: bytes) -> None:
        """For a new version: the window must neither send nor delete the old one (read or not)."""
        window = self._open.get((partition, window_of(due_ms)))
        if window is not None:
            window.removed.add(key)
