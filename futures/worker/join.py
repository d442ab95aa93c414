"""The join of ticks and requests, ordered by time.

A tick for second s on partition p fires p's timers due by s. A request of p
written before s — a cancel, a new version — must be applied first, or it would
lose to the tick. So, as in the Kafka Streams join the oscillator design comes from
(``PartitionGroup`` hands over the record with the smallest timestamp; ``max.task.idle.ms``
bounds the wait for a partition with no data in hand), a tick waits for the requests
of its partition that are older than it:

* the consumer knows, for each request partition, the timestamp up to which every
  request is applied — its **frontier** (:class:`RequestFrontier`): the timestamp of the
  oldest request fetched and not yet applied, or of the last applied one while the
  broker holds unread records; when everything was applied, the time the fetch request
  was sent whose response said so (the broker answered later, so a request written
  before it is in that response; one written after may be in no response seen yet);
* a partition's watermark moves to the tick's second only as far as its frontier allows
  (:meth:`WaitingTicks.claim`): the tick fires late, never ahead of a request written
  before it;
* a tick that waits longer than ``TIMERS_JOIN_MAX_WAIT_S`` fires anyway (a worker that
  far behind on requests must still fire its timers): counted in
  ``timers_join_wait_bound_total``, with how long ticks waited in ``timers_join_wait_seconds``.

Timestamps are compared as the broker keeps them: with ``CreateTime``, records of one
partition are in timestamp order only as far as their producers' clocks agree
(``message.timestamp.type=LogAppendTime`` on the request topics makes the order strict).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ktimers.logs import ThrottledLog

log = logging.getLogger(__name__)


class RequestFrontier(Protocol):
    def frontier_ms(self, partition: int) -> int | None:
        """Epoch ms before which every request of ``partition`` is applied; None when every
        request written to it is applied (nothing a tick must wait for)."""
        ...


class NoBacklog:
    """Every request is applied as it comes: the frontier of an engine driven directly (tests, tools)."""

    def frontier_ms(self, partition: int) -> int | None:
        return None


@dataclass
class _Waiting:
    second: int  # the highest tick second received for the partition
    since: float  # monotonic seconds: when its oldest tick not yet fired arrived


class WaitingTicks:
    """Per partition, the highest tick received and not yet fired, and how long it has waited."""

    def __init__(
        self,
        frontier: RequestFrontier,
        max_wait_s: float,
        *,
        on_waited: Callable[[float], None] = lambda seconds: None,
        on_bound: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.frontier = frontier
        self._max_wait_s = max_wait_s
        self._on_waited = on_waited
        self._on_bound = on_bound
        self._monotonic = monotonic
        self._waiting: dict[int, _Waiting] = {}
        self._bound_log = ThrottledLog(log)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def seconds(self) -> dict[int, int]:
        """Partition → the tick second it waits to fire."""
        return {p: w.second for p, w in self._waiting.items()}

    def note(self, partition: int, second: int, watermark: int) -> bool:
        """A tick for ``second``; False when it moves nothing (at or below the clock, or a copy)."""
        waiting = self._waiting.get(partition)
        if second <= (waiting.second if waiting is not None else watermark):
            return False
        if waiting is None:
            self._waiting[partition] = _Waiting(second, self._monotonic())
        else:
            waiting.second = second
        return True

    def held(self) -> dict[int, int]:
        """Partition → its frontier (epoch ms), of each waiting tick that requests older than it
        still hold back: what :meth:`claim` would not move all the way to the tick's second
        (one that has waited ``max_wait_s`` is not held: it fires anyway)."""
        now = self._monotonic()
        held: dict[int, int] = {}
        for partition, waiting in self._waiting.items():
            frontier_ms = self._behind(partition, waiting)
            if frontier_ms is not None and now - waiting.since < self._max_wait_s:
                held[partition] = frontier_ms
        return held

    def _behind(self, partition: int, waiting: _Waiting) -> int | None:
        """The partition's frontier (epoch ms) while requests older than its waiting tick are
        still to apply, else None."""
        frontier_ms = self.frontier.frontier_ms(partition)
        return frontier_ms if frontier_ms is not None and frontier_ms < waiting.second * 1000 else None

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the ticks of ``partitions`` (revoked: their new owner has ticks of its own)."""
        for partition in partitions:
            self._waiting.pop(partition, None)

    def claim(self, clock_s: int, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Partition → the second its watermark may move to now (of ``partitions``, or all waiting).

        Up to the tick's second, but never past ``clock_s``, the second this worker's own
        clock has reached (a tick ahead of it keeps waiting for it); and only to the
        partition's frontier while requests older than the tick are still to be applied (the
        rest keeps waiting), unless the tick has waited ``max_wait_s``.
        """
        now = self._monotonic()
        allowed: dict[int, int] = {}
        for partition in sorted(self._waiting if partitions is None else partitions):
            waiting = self._waiting.get(partition)
            if waiting is None:
                continue
            second = min(waiting.second, clock_s)
            frontier_ms = self._behind(partition, waiting)
            if frontier_ms is not None:
                if now - waiting.since < self._max_wait_s:
                    second = min(second, frontier_ms // 1000)
                else:
                    self._on_bound()
                    self._bound_log.warning(
                        "partition %d: tick %d waited %.1f s for older requests (TIMERS_JOIN_MAX_WAIT_S); "
                        "firing without them: a cancel or new version still unread may lose to it",
                        partition, waiting.second, now - waiting.since,
                    )  # fmt: skip
            if second == waiting.second:
                del self._waiting[partition]
                self._on_waited(now - waiting.since)
            allowed[partition] = second
        return allowed
