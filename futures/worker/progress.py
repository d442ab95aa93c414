"""Progress records on their way to the changelog, awaited without the engine lock.

A changelog write ends with one progress record per partition (watermark and last
applied request offset, :func:`~futures.worker.changelog.commit`), produced once the
write's other records are delivered. The engine need not hold its lock while the
broker takes it in — a round trip, many times a second (docs/PERFORMANCE.md#sustaining-a-rate) — so
the write applies itself to the tables as soon as the records it covers are delivered,
and its progress record lands while the next step runs. One rule keeps that as safe as
waiting: **nothing more is written to a partition's changelog until its progress
record has landed** (:meth:`InFlight.landed`, :meth:`InFlight.busy`). So the
changelog never holds a step's ``f`` records (timers fired) after requests whose
progress is missing: a restart that reads those requests again (their progress did not
land) finds none of their timers fired, and applies them again as a step cut short
would be.

On disk a table keeps the progress that landed, with the changelog offset of its
record (:meth:`~futures.worker.table.PartitionTimers.progress_landed`); in memory it
is ahead by the records in flight. A restart replays the changelog from that offset:
what was applied and not acknowledged is applied again, to the same state.

The same rule makes the owner the one writer between two of a partition's progress records that
it knows of: each progress record is expected where the write's own records leave it. One that
lands further says that someone else (a revoked owner, writing late) wrote in between: the table
notes the range, to read back and restate (:mod:`futures.worker.restate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from futures.worker.kafka import Deliveries, KafkaWriter
from futures.worker.table import PartitionTimers, Record


@dataclass(frozen=True)
class _Tail:
    """A partition's progress record in flight: its delivery report, the record, the table it was
    applied to."""

    deliveries: Deliveries
    record: Record
    table: PartitionTimers
    #: Where the write's first record lands if nobody else writes (None: not known), and how many
    #: records the write has, this one the last.
    first: int | None
    written: int


class InFlight:
    """Each partition's progress record produced and not yet known delivered (one at most)."""

    def __init__(self, writer: KafkaWriter, clock: Callable[[], int]) -> None:
        self._writer = writer
        #: Wall-clock epoch ms: a table whose progress landed held every record of its partition then.
        self._clock = clock
        self._tails: dict[int, _Tail] = {}

    def add(
        self,
        partition: int,
        deliveries: Deliveries,
        record: Record,
        table: PartitionTimers,
        first: int | None = None,
        written: int = 1,
    ) -> None:
        """Take ``partition``'s progress ``record``, just produced (into ``deliveries``) and
        applied to ``table`` in memory: the last of the ``written`` records of its write, the
        first expected at offset ``first`` (None: not known)."""
        if partition in self._tails:
            raise ValueError(f"partition {partition}'s last progress record has not landed")
        self._tails[partition] = _Tail(deliveries, record, table, first, written)

    def busy(self, partition: int) -> bool:
        """Whether ``partition``'s progress record is still on its way (reports served first)."""
        if partition not in self._tails:
            return False
        self.take_landed()
        return partition in self._tails

    async def landed(self, partitions: Iterable[int] | None = None) -> None:
        """Wait until the progress records of ``partitions`` (all if None) have landed; a failed
        one raises :class:`~ktimers.errors.DeliveryError` (the worker must stop)."""
        tails = self._tails
        wanted = list(tails) if partitions is None else [p for p in partitions if p in tails]
        if wanted:
            await self._writer.delivered(*(tails[p].deliveries for p in wanted))
        self.take_landed()

    def take_landed(self) -> None:
        """Record on disk the progress records whose reports came (served first); raise the first
        that failed."""
        if not self._tails:
            return
        self._writer.serve()
        for partition, tail in list(self._tails.items()):
            deliveries = tail.deliveries
            if deliveries.pending:
                continue
            del self._tails[partition]
            deliveries.raise_first("changelog progress")
            offset = deliveries.offsets.get(partition)
            if offset is not None and tail.first is not None and offset != tail.first + tail.written - 1:
                tail.table.landed_beyond(tail.first, offset)
            tail.table.progress_landed(tail.record, offset, self._clock())
