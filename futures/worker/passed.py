"""Offsets of the request partitions that hold no request: what the consumer read past.

A transactional producer leaves offsets no consumer is handed a record for: each commit
or abort writes a marker that takes an offset, and the records of an aborted transaction
are left out (the worker reads ``read_committed``). aiokafka's readers report each run
of such offsets as they pass it (:mod:`futures.worker.fetch`). The transport keeps them
here, per partition, for two uses:

* the engine, on a hole in the offsets it is handed, asks whether the consumer read past
  all of it (:meth:`PassedOffsets.covers`): then it holds no request and is not read back
  (:mod:`futures.worker.gaps`); a hole it did not read past (records Faust dropped during
  a rebalance) still is;
* Faust commits a partition's acked offsets only up to the first one not acked, so the
  transport acks those offsets too once they are reached (:meth:`PassedOffsets.applied`,
  :meth:`PassedOffsets.add`): the committed offset moves past markers, to the end of the
  partition, and the ack books empty at each commit.

What a partition keeps is what lies ahead of its last applied request: runs of offsets
fetched and not yet applied, cleared with the backlog at a rebalance.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Hashable

#: A run of offsets ``range(start, end)``.
Span = tuple[int, int]


class PassedOffsets:
    """Per partition, the runs of offsets the consumer read past without a record, merged and in order."""

    def __init__(self) -> None:
        self._spans: dict[Hashable, list[Span]] = {}
        #: Per partition, the offset before which every offset is applied or passed and acked
        #: (since the last rebalance).
        self._acked_to: dict[Hashable, int] = {}

    def spans(self, tp: Hashable) -> list[Span]:
        """The runs kept for ``tp``, in order."""
        return list(self._spans.get(tp, ()))

    def add(self, tp: Hashable, start: int, end: int) -> list[Span]:
        """Offsets ``start`` to ``end - 1`` of ``tp`` hold no request; returns the runs to ack now:
        those that continue what is acked already."""
        if end <= start:
            return []
        spans = self._spans.setdefault(tp, [])
        at = bisect_right(spans, (start, end))
        # Merge with the neighbours it touches or overlaps.
        while at > 0 and spans[at - 1][1] >= start:
            at -= 1
            start, end = min(start, spans[at][0]), max(end, spans[at][1])
            del spans[at]
        while at < len(spans) and spans[at][0] <= end:
            end = max(end, spans[at][1])
            del spans[at]
        spans.insert(at, (start, end))
        acked_to = self._acked_to.get(tp)
        if acked_to is None or not start <= acked_to < end:
            return []
        self._acked_to[tp] = end
        return [(acked_to, end)]

    def covers(self, tp: Hashable, start: int, end: int) -> bool:
        """Whether every offset from ``start`` to ``end - 1`` of ``tp`` was read past."""
        spans = self._spans.get(tp)
        if not spans:
            return False
        at = bisect_right(spans, (start, sys.maxsize)) - 1
        return at >= 0 and spans[at][0] <= start and end <= spans[at][1]

    def applied(self, tp: Hashable, last: int) -> list[Span]:
        """The requests of ``tp`` up to offset ``last`` are applied; returns the runs to ack now:
        those before ``last`` and the one right after it. Runs wholly before ``last`` are
        forgotten (a later hole starts after it)."""
        spans = self._spans.get(tp)
        acked_to = max(self._acked_to.get(tp, last + 1), last + 1)
        if not spans:
            self._acked_to[tp] = acked_to
            return []
        acks: list[Span] = []
        kept: list[Span] = []
        done = self._acked_to.get(tp, -1)
        for start, end in spans:
            if end <= last:
                if end > done:
                    acks.append((max(start, done), end))
                continue
            if start <= acked_to < end:
                acks.append((acked_to, end))
                acked_to = end
            kept.append((start, end))
        self._acked_to[tp] = acked_to
        if kept:
            self._spans[tp] = kept
        else:
            del self._spans[tp]
        return acks

    def resume_at(self, tp: Hashable, offset: int) -> None:
        """The consumer reads ``tp`` from ``offset`` on, every request before it applied: offsets
        read past from there are acked as they are reported."""
        self._acked_to[tp] = offset

    def forget(self, tp: Hashable) -> None:
        """Nothing more of ``tp`` is to be applied here (revoked)."""
        self._spans.pop(tp, None)
        self._acked_to.pop(tp, None)

    def clear(self) -> None:
        """A rebalance: what is applied or acked says nothing of the new assignment."""
        self._spans.clear()
        self._acked_to.clear()
