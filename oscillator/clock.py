"""When to tick, and for which second: pure logic over an injectable wall clock.

A tick for second ``s`` promises "the clock has reached ``s``", so it may only go
out once the wall clock reads ``s.000`` or later. Three rules follow:

* never early: second ``s`` is due at ``s.000`` epoch seconds, not a moment before;
* never twice: one instance emits each second at most once, even if the wall
  clock steps back (NTP), in which case it waits until the clock catches up;
* after a stall (GC pause, SIGSTOP, a slow broker call) only the current second
  goes out, not the backlog: a worker fires everything due up to the tick it
  sees, so the skipped seconds would add load and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]
"""Wall clock: epoch seconds as a float, like :func:`time.time`."""


class TickSchedule:
    """Decides which epoch second to tick next and how long to wait for it.

    Not thread-safe: one tick loop owns it.
    """

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._last: int | None = None

    @property
    def last_second(self) -> int | None:
        """The last epoch second handed out by :meth:`take`, or None before the first."""
        return self._last

    def _next_second(self, now_s: float) -> int:
        current = math.floor(now_s)
        if self._last is None:
            # The current second has begun, so its tick is already true: a fresh
            # instance need not wait up to a second to say so.
            return current
        return max(self._last + 1, current)

    def wait_s(self) -> float:
        """Seconds until the next tick is due; 0.0 when it is due now."""
        now_s = self._clock()
        return max(0.0, self._next_second(now_s) - now_s)

    def take(self) -> int | None:
        """The epoch second to tick now, marked as emitted; None when none is due yet.

        Returns each second at most once; after a stall it skips straight to the
        current second.
        """
        now_s = self._clock()
        second = self._next_second(now_s)
        if now_s < second:
            return None
        self._last = second
        return second
