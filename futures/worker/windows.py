"""Precise mode's bookkeeping: per partition, the timers being sent at their own millisecond.

On tick s the engine takes the timers due by s + 1 into a :class:`Window` and
sends them one by one as their due millisecond comes (``TimerEngine._send_window``).
They stay in the table until sent, so a crash re-sends them; a cancel or a new
version arriving meanwhile takes its timer out of the window (:meth:`Windows.cancel`,
:meth:`Windows.withdraw`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Window:
    """The timers of one partition due within the next second, being sent one by one."""

    held: set[str]
    sent: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)  # cancelled or replaced by ingest meanwhile
    task: asyncio.Task[None] | None = None


SendFn = Callable[[Window], Coroutine[Any, Any, None]]


class Windows:
    """The open windows, by partition."""

    def __init__(self) -> None:
        self._open: dict[int, Window] = {}

    def __bool__(self) -> bool:
        return bool(self._open)

    def open(
        self, partition: int, held: set[str], send: Callable[[Window], Coroutine[Any, Any, None]]
    ) -> None:
        """Run ``send(window)`` for the timers ``held``; it must call :meth:`close` when done."""
        window = Window(held=held)
        self._open[partition] = window
        window.task = asyncio.get_running_loop().create_task(send(window))

    def close(self, partition: int, window: Window) -> None:
        if self._open.get(partition) is window:
            del self._open[partition]

    async def done(self, partitions: Iterable[int]) -> None:
        """Wait until the windows of ``partitions`` have sent and deleted their timers."""
        for partition in partitions:
            window = self._open.get(partition)
            if window is not None and window.task is not None:
                await asyncio.shield(window.task)

    def cancel(self, partition: int, timer_id: str) -> bool:
        """For a cancel: take the timer out of its window; True if it was sent already."""
        window = self._open.get(partition)
        if window is None or timer_id not in window.held:
            return False
        if timer_id in window.sent:
            return True
        window.removed.add(timer_id)
        return False

    def withdraw(self, partition: int, timer_id: str) -> None:
        """For a new version: the window must neither send nor delete the old one."""
        window = self._open.get(partition)
        if window is not None and timer_id in window.held:
            window.removed.add(timer_id)
