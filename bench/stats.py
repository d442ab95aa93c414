"""Figures from raw observations: lateness percentiles, rates, rates over time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]

#: (time in seconds, running count) pairs, in time order.
Samples = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Lateness:
    """Receive time minus due time of the callbacks of one workload (milliseconds)."""

    expected: int
    received: int
    #: Callbacks received before their due time (never allowed).
    early: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    #: The same at dispatch, by the dispatcher's own clock (``kt-fired-ms`` − due).
    fired_p50_ms: float
    fired_p99_ms: float
    fired_max_ms: float
    #: Callbacks received again, of a timer received before (none without a crash); None in
    #: results recorded before the collector kept ids.
    repeats: int | None = None

    @property
    def missing(self) -> int:
        return max(0, self.expected - (self.received - (self.repeats or 0)))


def lateness(expected: int, due_ms: Ints, fired_ms: Ints, received_ms: Ints, ids: Ints) -> Lateness:
    """``ids``: a number per timer id (its hash), to tell a repeat from another timer."""
    late = received_ms - due_ms
    if late.size == 0:
        nan = float("nan")
        return Lateness(expected, 0, 0, nan, nan, nan, nan, nan, nan, nan)
    fired = fired_ms - due_ms
    return Lateness(
        expected=expected,
        received=int(late.size),
        early=int(np.count_nonzero(late < 0)),
        repeats=int(ids.size - np.unique(ids).size),
        p50_ms=float(np.percentile(late, 50)),
        p99_ms=float(np.percentile(late, 99)),
        max_ms=float(late.max()),
        min_ms=float(late.min()),
        fired_p50_ms=float(np.percentile(fired, 50)),
        fired_p99_ms=float(np.percentile(fired, 99)),
        fired_max_ms=float(fired.max()),
    )


def burst_rate(received_ms: Ints) -> float:
    """Callbacks per second between the first and the last received (0 if under two).

    All arrivals of a batch share one receive time, so the span is what the
    receiver saw: the dispatch of a hot second from its first to its last record.
    """
    if received_ms.size < 2:
        return 0.0
    span_s = (int(received_ms.max()) - int(received_ms.min())) / 1000
    # A burst that arrived within one poll: bounded below by the poll interval.
    return received_ms.size / max(span_s, 0.001)


def rise_rate(samples: Samples, start: float, end: float) -> float:
    """Rate at which a running count went from ``start`` to ``end`` (per second).

    Uses samples strictly inside the rise: their counts are exact at their times,
    and the span they bound has no idle time before the rise or after it. With
    fewer than two inside, the span runs to the first sample at ``end``, and from
    the last one at ``start`` if the whole rise fell between two samples: a lower
    bound then (tiny counts only). Returns 0 without two samples to compare.
    """
    inside = [(t, n) for t, n in samples if start < n < end]
    if len(inside) < 2:
        risen = [(t, n) for t, n in samples if n > start]
        done = [(t, n) for t, n in risen if n >= end]
        before = [(t, n) for t, n in samples if n <= start]
        if not done:
            return 0.0
        if risen[0] != done[0]:
            inside = [risen[0], done[0]]
        elif before:
            inside = [before[-1], done[0]]
        else:
            return 0.0
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def rate_series(received_ms: Ints, origin_ms: int, bucket_s: float) -> tuple[list[float], list[float]]:
    """Arrivals per second in buckets of ``bucket_s`` seconds: (bucket start − origin, rate)."""
    if received_ms.size == 0:
        return [], []
    offsets_s = (received_ms - origin_ms) / 1000
    first = np.floor(offsets_s.min() / bucket_s) * bucket_s
    last = offsets_s.max()
    edges = np.arange(first, last + bucket_s, bucket_s)
    if edges.size < 2:
        edges = np.array([first, first + bucket_s])
    counts, edges = np.histogram(offsets_s, bins=edges)
    return [float(e) for e in edges[:-1]], [float(c / bucket_s) for c in counts]


def lateness_growth(due_ms: Ints, received_ms: Ints) -> float:
    """How much later the last timers due were than the first (ms): the rise, over the span of the
    due times, of a line fitted through the median lateness of each due second (0 under two seconds).

    A system that keeps up is as late at the end of a steady workload as at its start, whatever
    each second's spread; one that falls behind is later every second.
    """
    if due_ms.size == 0:
        return 0.0
    second = (due_ms - due_ms.min()) // 1000
    late = received_ms - due_ms
    seconds = np.unique(second)
    if seconds.size < 2:
        return 0.0
    medians = [float(np.median(late[second == s])) for s in seconds]
    slope = float(np.polyfit(seconds.astype(float), medians, 1)[0])
    return slope * float(seconds[-1] - seconds[0])
