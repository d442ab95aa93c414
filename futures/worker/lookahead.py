"""Second mode: the callbacks of the next second, built while the worker waits for its tick.

A tick fires every timer due by its second in one go; building their callbacks then
(:func:`~futures.worker.callbacks.prepare`) is on the path of every callback but the
first. Between ticks the worker is mostly idle, so after a partition's clock moves
to s, :meth:`Lookahead.moved` starts building its timers due by s + 1, a few hundred
at a time under the engine lock (ticks and requests go on between), while the
budget allows: its share of ``TIMERS_FIRE_BUDGET_BYTES`` across partitions (``FireBudget.ahead``).

A callback built ahead is used only when the timer the tick's scan reads is stored
exactly as it was built from (:meth:`Lookahead.take`): one replaced, cancelled or
added since is built at the tick, as without this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping

from futures.worker.callbacks import Callback
from futures.worker.context import EngineContext, callback_bytes
from futures.worker.prepare import prepare

log = logging.getLogger(__name__)

#: Timers built ahead at a time, holding the engine lock (~2 ms).
_BUILD_AT_ONCE = 500


class Lookahead:
    def __init__(self, ctx: EngineContext) -> None:
        self._ctx = ctx
        self.max_bytes = ctx.budget.ahead
        #: partition → table key → the callback, the stored timer it was built from, and the
        #: bytes both hold (counted once, when built).
        self._ready: dict[int, dict[bytes, tuple[Callback, bytes, int]]] = {}
        self._count = 0
        self.bytes = 0
        self._ahead: dict[int, int] = {}  # partition → the second its clock is at, to build past
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return self._count

    def partitions(self) -> list[int]:
        return [*self._ready, *self._ahead]

    def moved(self, moved: Mapping[int, int]) -> None:
        """The clocks of ``moved`` (partition → second) moved: build what their next tick fires."""
        for partition in list(self._ready):
            if partition in moved or not self._ctx.owns(partition):
                self.drop(partition)  # fired by now, or the partition went elsewhere
        self._ahead.update(moved)
        if self._ahead and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._build())

    async def built(self) -> None:
        """Wait until what :meth:`moved` started is built (tests and benchmarks)."""
        if self._task is not None:
            await self._task

    def drop(self, partition: int) -> None:
        """Forget what was built for ``partition`` (a new second is built, or it was revoked)."""
        self._ahead.pop(partition, None)
        ready = self._ready.pop(partition, {})
        self._count -= len(ready)
        self.bytes -= sum(held for _, _, held in ready.values())

    def take(self, items: Iterable[tuple[bytes, int, bytes]]) -> Iterator[Callback]:
        """The callbacks of the timers ``items`` ((table key, partition, stored bytes)) as a tick's
        scan read them: built ahead where still valid, else built now."""
        ready = self._ready
        for key, partition, stored in items:
            callbacks = ready.get(partition)
            built = None if callbacks is None else callbacks.pop(key, None)
            if built is None:
                yield prepare(key, partition, stored)
                continue
            callback, built_from, held = built
            self._count -= 1
            self.bytes -= held
            yield callback if built_from == stored else prepare(key, partition, stored)

    def _fill(self, partition: int, items: Iterable[tuple[bytes, bytes]]) -> None:
        ready = self._ready.setdefault(partition, {})
        for key, stored in items:
            callback = prepare(key, partition, stored)
            old = ready.get(key)
            if old is None:
                self._count += 1
            else:
                self.bytes -= old[2]
            held = callback_bytes(callback) + len(stored)
            ready[key] = (callback, stored, held)
            self.bytes += held

    async def _build(self) -> None:
        """Build the timers due in the second after each clock of ``self._ahead``, a few hundred
        at a time, while the budget allows."""
        ctx = self._ctx
        try:
            while self._ahead:
                partition, second = self._ahead.popitem()
                after: bytes | None = None
                while self.bytes < self.max_bytes:
                    async with ctx.lock:
                        # Revoked, or its clock moved on meanwhile (that move queued its own turn).
                        table = ctx.tables(partition)
                        if not ctx.owns(partition) or table.watermark != second:
                            break
                        # Each kept with its stored timer: half the room, as stored timers.
                        room = (self.max_bytes - self.bytes) // 2
                        due = table.due_items(
                            (second + 1) * 1000, _BUILD_AT_ONCE, after=after, max_bytes=room
                        )
                        self._fill(partition, due)
                    if len(due) < _BUILD_AT_ONCE:
                        break
                    after = due[-1][0]
                    await asyncio.sleep(0)
        except Exception:
            # Only a head start is lost: the tick builds what is not built, and meets
            # the same problem, if it is one, where it is handled.
            log.warning("building the next second's callbacks failed", exc_info=True)
            self._ahead.clear()
