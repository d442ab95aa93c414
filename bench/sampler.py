"""Sample a reading (a metric, a process's memory) in the background while a load runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Sampler:
    """Calls ``read`` every ``interval_s`` seconds from a thread, keeping (epoch s, value).

    Stops when ``stop()`` is called, when a value reaches ``until``, or after
    ``timeout_s``. A reading that raises ``OSError`` (a scrape that failed) is skipped.
    """

    def __init__(
        self,
        read: Callable[[], float],
        interval_s: float,
        *,
        until: float | None = None,
        timeout_s: float = 3600.0,
    ) -> None:
        self.samples: list[tuple[float, float]] = []
        self._read, self._interval, self._until = read, interval_s, until
        self._deadline = time.monotonic() + timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                value = self._read()
            except OSError:
                value = None
            if value is not None:
                self.samples.append((time.time(), value))
                if self._until is not None and value >= self._until:
                    return
            self._stop.wait(self._interval)

    def wait(self) -> None:
        """Block until the sampler ends by itself (target reached or timed out)."""
        self._thread.join()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def peak(self) -> float:
        return max((v for _, v in self.samples), default=0.0)

    @property
    def last(self) -> float:
        return self.samples[-1][1] if self.samples else 0.0
