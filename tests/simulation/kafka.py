"""A pure-Python Kafka log: offsets, compaction, tombstone expiry and transactions.

Modelled:

* **partitions** of append-only records with offsets; a record keeps its offset for ever;
* **compaction** (:meth:`SimKafka.compact`), at any moment, of a partition's log up to a cut
  (the active segment past it is never cleaned): a record is removed when a later record of the
  same key lies at or below the cut, so offsets leave gaps, as Kafka's cleaner does;
* **tombstone expiry**: a tombstone the cleaner passed is kept for ``delete.retention.ms``
  after that first pass, then the next pass removes it (a consumer that read the log before
  has seen it, one that reads it after never will);
* **transactions**: a transactional producer's records, then a commit or abort marker at an
  offset of its own that no consumer receives; ``read_committed`` skips aborted records and
  stops before an open transaction, ``read_uncommitted`` returns them all.

Not modelled: replication, leader changes, segment files (the cut stands for them), retention
by time or size on non-compacted topics, quotas, record batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class TxnState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass
class LogRecord:
    """One record as the broker keeps it, with what the simulation knows of its writer."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int  # as the broker keeps it: the true time at which it was written
    writer: str = ""  # a worker's name, a client's, an oscillator's
    writer_clock_ms: int = 0  # the writer's own clock when it produced the record
    txn: int | None = None  # transactional id of the writer's transaction, if any
    marker: TxnState | None = None  # a commit or abort marker (no data)
    cleaned_at_ms: int | None = None  # a tombstone: when the cleaner first passed it


@dataclass
class Partition:
    records: list[LogRecord] = field(default_factory=list)
    next_offset: int = 0
    #: Offsets of tombstones the cleaner removed after delete.retention.ms (for the world's gates).
    expired: list[int] = field(default_factory=list)

    def append(self, record: LogRecord) -> int:
        record.offset = self.next_offset
        self.next_offset += 1
        self.records.append(record)
        return record.offset

    def at_or_after(self, offset: int) -> int:
        """Index in :attr:`records` of the first record at or after ``offset``."""
        lo, hi = 0, len(self.records)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.records[mid].offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo


class SimKafka:
    """Every topic's partitions, and the transactions of every transactional producer."""

    def __init__(self) -> None:
        self.topics: dict[str, list[Partition]] = {}
        self.txns: dict[int, TxnState] = {}
        self._next_txn = 0

    def create(self, topic: str, partitions: int) -> None:
        self.topics[topic] = [Partition() for _ in range(partitions)]

    def partition(self, topic: str, partition: int) -> Partition:
        """A topic's partition; a topic the world did not create has as many as are written to."""
        parts = self.topics.setdefault(topic, [])
        while len(parts) <= partition:
            parts.append(Partition())
        return parts[partition]

    def append(self, topic: str, partition: int, record: LogRecord) -> int:
        return self.partition(topic, partition).append(record)

    # -- transactions ---------------------------------------------------------

    def begin(self) -> int:
        self._next_txn += 1
        self.txns[self._next_txn] = TxnState.OPEN
        return self._next_txn

    def end(
        self, txn: int, state: TxnState, touched: list[tuple[str, int]], now_ms: int, writer: str
    ) -> None:
        """Commit or abort ``txn``: a marker in each partition it wrote to."""
        self.txns[txn] = state
        for topic, partition in sorted(set(touched)):
            self.append(topic, partition, LogRecord(0, None, None, (), now_ms, writer, now_ms, txn, state))

    # -- reading --------------------------------------------------------------

    def end_offset(self, topic: str, partition: int, *, committed: bool) -> int:
        """The high watermark, or with ``committed`` the last stable offset (before any open transaction)."""
        part = self.partition(topic, partition)
        if committed:
            for record in part.records:
                if (
                    record.txn is not None
                    and record.marker is None
                    and self.txns[record.txn] is TxnState.OPEN
                ):
                    return record.offset
        return part.next_offset

    def read(
        self, topic: str, partition: int, start: int, max_records: int, *, committed: bool
    ) -> tuple[list[LogRecord], int]:
        """Data records at offsets ``start`` .. end (or the LSO), at most ``max_records``; and the
        position after them (past skipped markers and aborted records, as a consumer moves)."""
        part = self.partition(topic, partition)
        end = self.end_offset(topic, partition, committed=committed)
        found: list[LogRecord] = []
        position = start
        for record in part.records[part.at_or_after(start) :]:
            if record.offset >= end or len(found) >= max_records:
                break
            position = record.offset + 1
            if record.marker is not None:
                continue
            if committed and record.txn is not None and self.txns[record.txn] is TxnState.ABORTED:
                continue
            found.append(record)
        if len(found) < max_records:
            position = max(position, end)
        return found, position

    # -- compaction -------------------------------------------------------------

    def compact(self, topic: str, partition: int, cut: int, now_ms: int, delete_retention_ms: int) -> int:
        """Clean ``partition`` up to offset ``cut`` (exclusive): each key's latest record at or below it
        survives, older ones go; a tombstone goes once delete.retention.ms passed since the first
        clean that reached it. The number of records removed."""
        part = self.partition(topic, partition)
        latest: dict[bytes, int] = {}
        for record in part.records:
            if record.offset >= cut:
                break
            if record.key is not None and record.marker is None:
                latest[record.key] = record.offset
        kept: list[LogRecord] = []
        for record in part.records:
            if record.offset < cut and record.key is not None and record.marker is None:
                if latest[record.key] != record.offset:
                    continue
                if record.value is None:
                    if record.cleaned_at_ms is None:
                        record.cleaned_at_ms = now_ms
                    elif now_ms - record.cleaned_at_ms >= delete_retention_ms:
                        part.expired.append(record.offset)
                        continue
            kept.append(record)
        removed = len(part.records) - len(kept)
        part.records = kept
        return removed
