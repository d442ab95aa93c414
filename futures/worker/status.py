"""What this worker saw lately — ticks, firings, dead letters — for the admin API.

The engine reports into a :class:`WorkerStatus` as it works; the admin views read
it. Everything here is in memory and bounded whatever the load: a ring of recent
firings, a ring of lateness samples, one bucket per second for the last minute,
one entry per partition, and at most ``max_oscillators`` oscillators. A restart
starts it empty (the tables, not this, are the state of the timers).

Times are epoch milliseconds unless a name says ``_s`` (seconds).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: The oscillator name shown for ticks that carry none (seed ticks keyed by the second only).


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Firing(NamedTuple):
    """One delivered callback (a tuple: one is made per fired timer)."""

    timer_id: str
    partition: int
    due_ms: int
    fired_ms: int

    @property
    def lateness_ms(self) -> int:
        return max(self.fired_ms - self.due_ms, 0)


@dataclass
class PartitionTicks:
    """The last tick this worker read for one partition (advancing or not)."""

    second: int  # highest epoch second announced so far
    received_ms: int  # worker clock when the latest tick arrived
    source: str  # oscillator of the latest tick


@dataclass
class OscillatorSeen:
    """One oscillator instance, named by the ``source`` of its ticks."""

    source: str
    last_second: int
    last_seen_ms: int
    ticks: int


@dataclass
class DeadLetters:
    """Records dead-lettered for one reason."""

    count: int
    last_ms: int


@dataclass(frozen=True)
class Lateness:
    """Quantiles of fire time minus due time over the recent firings, in seconds."""

    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    samples: int


def _quantile(ordered: list[int], q: float) -> int:
    # Nearest rank: a value that was observed, never an interpolation.
    index = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))
    return ordered[index]


class WorkerStatus:
    """Recent activity of one worker. Not thread-safe: the engine and the web views share one event loop."""

    def __init__(
        self,
        *,
        recent_firings: int = 200,
        lateness_samples: int = 10_000,
        max_oscillators: int = 64,
        clock: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self._clock = clock
        self.started_ms = clock()
        self._firings: deque[Firing] = deque(maxlen=recent_firings)
        self._lateness: deque[int] = deque(maxlen=lateness_samples)
        # [epoch second, firings in it] for the last minute; one entry per busy second.
        self._per_second: deque[list[int]] = deque(maxlen=61)
        self._ticks: dict[int, PartitionTicks] = {}
        # Least recently seen first, so the oldest is evicted when a new one appears.
        self._oscillators: OrderedDict[str, OscillatorSeen] = OrderedDict()
        self._max_oscillators = max_oscillators
        self._dead_letters: dict[str, DeadLetters] = {}

    # -- reported by the engine ------------------------------------------------

    def tick(self, partition: int, second: int, source: str) -> None:
        """A valid tick of oscillator ``source`` announcing ``second`` (epoch s) was read in ``partition``."""
        now = self._clock()
        last = self._ticks.get(partition)
        if last is None:
            self._ticks[partition] = PartitionTicks(second, now, source)
        else:
            last.second, last.received_ms, last.source = max(last.second, second), now, source
        seen = self._oscillators.pop(source, None)
        if seen is None:
            seen = OscillatorSeen(source, second, now, 0)
            if len(self._oscillators) >= self._max_oscillators:
                self._oscillators.popitem(last=False)
        seen.last_second, seen.last_seen_ms = max(seen.last_second, second), now
        seen.ticks += 1
        self._oscillators[source] = seen

    def fired(self, timer_id: str, partition: int, due_ms: int, fired_ms: int) -> None:
        """The callback of a timer was acknowledged by the broker."""
        firing = Firing(timer_id, partition, due_ms, fired_ms)
        self.fired_many([firing], [firing.lateness_ms], [fired_ms])

    @property
    def keeps(self) -> int:
        """How many of the newest firings :meth:`fired_many` keeps."""
        return self._firings.maxlen or 0

    def fired_many(self, recent: Sequence[Firing], lateness_ms: Sequence[int], fired: Sequence[int]) -> None:
        """Callbacks acknowledged by the broker, in firing order: the dispatch time of each
        (``fired``, epoch ms) and its lateness; ``recent``, the newest of them (:attr:`keeps`)."""
        self._firings.extend(recent)
        self._lateness.extend(lateness_ms[-(self._lateness.maxlen or len(lateness_ms)) :])
        if not fired:
            return
        per_second = self._per_second
        first, last = fired[0] // 1000, fired[-1] // 1000
        # A piece fired at one instant is one count: this runs for every piece of a hot second.
        seconds = [(first, len(fired))] if first == last else Counter(f // 1000 for f in fired).items()
        for second, count in seconds:
            if per_second and per_second[-1][0] == second:
                per_second[-1][1] += count
            else:
                per_second.append([second, count])

    def dead_letter(self, reason: str) -> None:
        """A record was written to the dead-letter topic with this reason code."""
        entry = self._dead_letters.get(reason)
        if entry is None:
            self._dead_letters[reason] = DeadLetters(1, self._clock())
        else:
            entry.count += 1
            entry.last_ms = self._clock()

    # -- read by the admin API -------------------------------------------------

    def now_ms(self) -> int:
        return self._clock()

    def recent_firings(self, limit: int) -> list[Firing]:
        """The last ``limit`` firings, newest first."""
        newest = list(self._firings)[-limit:] if limit > 0 else []
        newest.reverse()
        return newest

    def fired_last_minute(self) -> int:
        since = self._clock() // 1000 - 60
        return sum(count for second, count in self._per_second if second > since)

    def lateness(self) -> Lateness:
        """Quantiles over the last ``lateness_samples`` firings."""
        if not self._lateness:
            return Lateness(None, None, None, 0)
        ordered = sorted(self._lateness)
        return Lateness(
            _quantile(ordered, 0.50) / 1000,
            _quantile(ordered, 0.99) / 1000,
            ordered[-1] / 1000,
            len(ordered),
        )

    def partition_ticks(self) -> dict[int, PartitionTicks]:
        return dict(self._ticks)

    def oscillators(self) -> list[OscillatorSeen]:
        """Oscillators seen since start, most recently seen first."""
        return list(reversed(self._oscillators.values()))

    def dead_letters(self) -> dict[str, DeadLetters]:
        return dict(self._dead_letters)
