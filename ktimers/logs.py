"""Log lines whose rate input cannot drive: a flood of bad records is a few lines and a count.

Metrics count every rejected record; the log is for a person to see that it
happens and an example of why. One line per record would let a producer of
bad input fill disks and slow the worker that writes them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class ThrottledLog:
    """At most ``burst`` lines per ``interval_s`` seconds; the next line logged says how many were dropped."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 10,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._interval_s = interval_s
        self._clock = clock
        self._window_start = float("-inf")
        self._logged = 0
        self.suppressed = 0  # lines dropped since the last one logged

    def warning(self, msg: str, *args: object) -> None:
        self.log(logging.WARNING, msg, *args)

    def error(self, msg: str, *args: object, exc_info: bool = False) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=exc_info)

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
        now = self._clock()
        if now - self._window_start >= self._interval_s:
            self._window_start, self._logged = now, 0
        if self._logged >= self._burst:
            self.suppressed += 1
            return
        self._logged += 1
        if self.suppressed:
            msg += " (%d similar line(s) suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self._logger.log(level, msg, *args, exc_info=exc_info)
