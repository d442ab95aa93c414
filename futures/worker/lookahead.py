"""Second mode: the callbacks of the next second, built while the worker waits for its tick.

A tick fires every timer due by its second in one go; building their callbacks then
(:func:`~futures.worker.callbacks.prepare`) is on the path of every callback but the
first. Between ticks the worker is mostly idle, so after a partition's watermark moves
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

from futures.worker.built_ahead import BuiltAhead
from futures.worker.callbacks import Callback, Item
from futures.worker.context import EngineContext

log = logging.getLogger(__name__)

#: Timers built ahead at a time, holding the engine lock: briefly enough that a tick or a step
#: waits little for it (docs/PERFORMANCE.md#firing-a-timer).
_BUILD_AT_ONCE = 500


class Lookahead:
    def __init__(self, ctx: EngineContext) -> None:
        self._ctx = ctx
        self.max_bytes = ctx.budget.ahead
        self._built = BuiltAhead()  # in compiled code: every fired timer passes through it
        self._ahead: dict[int, int] = {}  # partition → its watermark, to build past
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return self._built.count

    @property
    def held(self) -> int:
        """What the callbacks built ahead and their stored timers hold."""
        return self._built.held

    def partitions(self) -> list[int]:
        return [*self._built.partitions(), *self._ahead]

    def moved(self, moved: Mapping[int, int]) -> None:
        """The watermarks of ``moved`` (partition → second) moved: build what their next tick fires."""
        for partition in self._built.partitions():
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
        self._built.drop(partition)

    def take(self, items: Iterable[Item], refused: list[Item]) -> Iterator[Callback]:
        """The callbacks of the timers ``items`` ((table key, partition, stored bytes)) as a tick's
        scan read them: built ahead where still valid, else built now; those whose bytes cannot
        be built are appended to ``refused`` instead."""
        return self._built.take(items, refused)

    async def _build(self) -> None:
        """Build the timers due in the second after each watermark of ``self._ahead``, a few hundred
        at a time, while the budget allows."""
        ctx = self._ctx
        try:
            while self._ahead:
                partition, second = self._ahead.popitem()
                after: bytes | None = None
                while self.held < self.max_bytes:
                    async with ctx.lock:
                        # Revoked, or its watermark moved on meanwhile (that move queued its own turn).
                        table = ctx.tables(partition)
                        if not ctx.owns(partition) or table.watermark != second:
                            break
                        # Each kept with its stored timer: half the room, as stored timers.
                        room = (self.max_bytes - self.held) // 2
                        due = table.due_items(
                            (second + 1) * 1000, _BUILD_AT_ONCE, after=after, max_bytes=room
                        )
                        self._built.fill(partition, due)
                    if len(due) < _BUILD_AT_ONCE:
                        break
                    after = due[-1][0]
                    await asyncio.sleep(0)
        except Exception:
            # Only a head start is lost: the tick builds what is not built, and meets
            # the same problem, if it is one, where it is handled.
            log.warning("building the next second's callbacks failed", exc_info=True)
            self._ahead.clear()
