"""A changelog partition as real Kafka holds it: records at offsets, compacted, tombstones expired.

The embedded broker never compacts and never expires a tombstone, so what a restore reads from a
long-lived cluster is built here from the records the engine produced (``FakeProducer.sent``):

* :func:`compact` keeps each key's latest record, at its own offset (a compacted partition keeps
  its offsets, with gaps where superseded records were); with ``expire_tombstones`` the
  tombstones go too, as they do ``delete.retention.ms`` after they were written;
* :class:`PartitionLog` is one partition fed by several owners in turn, each appending what it
  wrote;
* :func:`restore` replays records into a table as Faust's recovery does: in batches, each with
  the offset of its last record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from futures.worker.table import PartitionTimers
from tests.worker.fakes import Sent


@dataclass(frozen=True)
class LogRecord:
    """One record of the partition: its offset, key and value (None: a tombstone)."""

    offset: int
    key: bytes
    value: bytes | None


def compact(records: Sequence[LogRecord], expire_tombstones: bool = False) -> list[LogRecord]:
    """What Kafka's log cleaner leaves of ``records`` at worst: each key's latest record, in offset
    order and at its offset; with ``expire_tombstones``, none of the tombstones either."""
    latest = {record.key: record.offset for record in records}
    return [
        record
        for record in records
        if latest[record.key] == record.offset and not (expire_tombstones and record.value is None)
    ]


class PartitionLog:
    """One changelog partition, appended to by whichever worker owns it."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []

    @property
    def end(self) -> int:
        """The offset the next record gets."""
        return len(self.records)

    def append(self, written: Iterable[Sent]) -> None:
        """Append what an owner wrote (its producer's delivered changelog records, in order)."""
        for sent in written:
            self.records.append(LogRecord(self.end, sent.key or b"", sent.value))

    def read(self, start: int = 0) -> list[LogRecord]:
        """The records from offset ``start`` on, uncompacted."""
        return self.records[start:]


def restore(table: PartitionTimers, records: Sequence[LogRecord], batch: int = 97) -> None:
    """Replay ``records`` into ``table`` as Faust's recovery does: ``batch`` records at a time (a
    number that cuts the writes anywhere), each batch with its last record's offset."""
    for start in range(0, len(records), batch):
        part = records[start : start + batch]
        table.apply([(record.key, record.value) for record in part], part[-1].offset)
