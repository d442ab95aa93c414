"""Virtual time for asyncio: an event loop whose clock moves only when nothing is ready.

Each simulated worker has a loop of its own, so that a crash can stop it between any two
callbacks and leave its coroutines where they were (a killed process runs no ``finally``).
The world runs every live worker's loop up to the same instant (:meth:`SimLoop.run_until`);
within a loop, callbacks run in asyncio's own deterministic order, and a sleep or a timeout
takes no real time. CPU time is charged where it is long enough to matter: reading a table
(:meth:`SimLoop.charge`, from :class:`~tests.simulation.worker.SimTable`). Threads are not
modelled: nothing the simulation drives uses one.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _Selector(selectors.DefaultSelector):
    """Never blocks: waiting ``timeout`` seconds moves the loop's clock instead (never past the
    instant the loop runs to: a timer there stops it)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: SimLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        if loop is not None and timeout is not None and timeout > 0:
            loop.now_s = max(loop.now_s, min(loop.now_s + timeout, loop.limit_s))
        return super().select(0)


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual seconds (``now_s``), run in slices up to an instant."""

    def __init__(self, start_s: float) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self.now_s = start_s
        self.limit_s = start_s
        self.set_exception_handler(_quiet)

    def time(self) -> float:
        return self.now_s

    def charge(self, seconds: float) -> None:
        """CPU time spent by the code running now (a table read): the clock moves on, past the
        instant the loop runs to if need be, and the loop stops at its next turn, so the world
        moves on (other workers, oscillators) before its next callback runs."""
        self.now_s += seconds

    def run_until(self, instant_s: float) -> None:
        """Run every callback due up to ``instant_s`` (nothing, if CPU time took the loop past it).
        A crash stops the loop earlier (:meth:`stop`)."""
        if self.now_s >= instant_s:
            return
        self.limit_s = instant_s
        stop = self.call_at(instant_s, self.stop)
        self.run_forever()
        stop.cancel()

    def __del__(self) -> None:
        """Left open when dropped (asyncio closes a dropped loop): a crashed worker's coroutines
        are collected after it, and one closed inside ``async with lock`` wakes the lock's next
        waiter through ``call_soon``, which a closed loop refuses. Its sockets close with them."""


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A crashed worker's tasks are dropped pending: that is what a crash is, not an error."""
