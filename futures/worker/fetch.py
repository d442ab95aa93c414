"""How aiokafka unpacks fetches for the worker: header keys that are not UTF-8, and offsets read past.

**Header keys.** Fetched records whose header keys are not UTF-8 reach the engine instead
of stopping the consumer.

Kafka header keys are meant to be UTF-8, but the broker does not check, and
some clients send any bytes. aiokafka decodes every header key strictly while
it unpacks a fetch (its C extension), so one such record raises inside the
consumer — before any code of ours sees it — and, read again after the
restart, stops every worker that takes the partition over.

:func:`install` wraps the ``MemoryRecords`` of aiokafka's fetcher: batches
are still unpacked by the C extension; only a batch that fails to decode is
unpacked again in Python with ``surrogateescape`` header keys
(:class:`futures.worker.faust_adapter.LenientPythonBatch`), from the record
after the last one already delivered. Such a key reaches the engine
as a ``str`` with lone surrogates (:func:`ktimers.wire.printable_header_key`
turns it back into text a producer accepts), and the record is judged like any
other: a parser that needs the header rejects it with a reason.

**Offsets read past.** A transactional producer's commit or abort writes a marker that
takes an offset, and the worker's consumer (``read_committed``) leaves out the records of
aborted transactions: offsets no record is delivered for. :func:`install` also makes
aiokafka's readers of fetched partitions report each run of such offsets
(:class:`futures.worker.faust_adapter.PartitionRecordsBase`), on the consumer's thread,
where :func:`take_passed` collects them after each fetch. The transport then knows that a
hole in the offsets it hands the engine holds no request, without reading it back
(:mod:`futures.worker.gaps`), and books those offsets as done, so that the committed offset
moves past them.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from aiokafka.errors import CorruptRecordException
from aiokafka.record.memory_records import MemoryRecords

from futures.worker import faust_adapter

_LOG_OVERHEAD = struct.calcsize(">qi")  # base offset, batch length
_LENGTH = struct.Struct(">i")
_MAGIC_OFFSET = struct.calcsize(">qii")


class _Batch:
    """One record batch: the C extension's, re-read leniently only when its header keys fail to decode."""

    def __init__(self, batch: Any, raw: memoryview) -> None:
        self._batch = batch
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __next__(self) -> Any:
        # aiokafka reads a control batch's record this way (``read_committed``: is it an abort marker?).
        return next(self._batch)

    def __iter__(self) -> Iterator[Any]:
        last = -1
        try:
            for record in self._batch:
                last = record.offset
                yield record
        except (CorruptRecordException, UnicodeDecodeError) as exc:
            if not _is_decode_error(exc):
                raise
            for record in faust_adapter.LenientPythonBatch(self._raw):
                if record.offset > last:
                    yield record


def _is_decode_error(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, UnicodeDecodeError) or "UnicodeDecodeError" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


class LenientMemoryRecords:
    """aiokafka's ``MemoryRecords`` that keeps each batch's bytes for a lenient second read."""

    def __init__(self, data: bytes) -> None:
        self._records = MemoryRecords(data)
        self._data = memoryview(data)
        self._pos = 0

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None:
            return None
        start = self._pos
        end = start + _LOG_OVERHEAD + _LENGTH.unpack_from(self._data, start + 8)[0]
        self._pos = end
        if self._data[start + _MAGIC_OFFSET] < 2:
            return batch  # legacy formats have no headers
        return _Batch(batch, self._data[start:end])


#: Runs of offsets read past that a thread keeps until :func:`take_passed`: more than a fetch
#: reports; on a thread that never takes them (another aiokafka consumer), the oldest go.
MAX_PASSED = 100_000

_reported = threading.local()


def _passed_here() -> deque[tuple[Any, int, int]]:
    passed: deque[tuple[Any, int, int]] | None = getattr(_reported, "passed", None)
    if passed is None:
        passed = _reported.passed = deque(maxlen=MAX_PASSED)
    return passed


class ReportingPartitionRecords(faust_adapter.PartitionRecordsBase):
    """aiokafka's reader of a fetched partition, keeping the offsets it reads past for :func:`take_passed`."""

    def on_passed(self, tp: Any, start: int, end: int) -> None:
        _passed_here().append((tp, start, end))


def take_passed() -> list[tuple[Any, int, int]]:
    """The runs of offsets ``(tp, start, end)`` this thread's fetches read past without a record,
    since the last call: no offset from ``start`` to ``end - 1`` of ``tp`` holds a record the
    consumer delivers (a transaction marker, an aborted transaction's record)."""
    passed = _passed_here()
    taken = list(passed)
    passed.clear()
    return taken


def install() -> None:
    """Make every aiokafka consumer of this process unpack fetches with :class:`LenientMemoryRecords`
    and report the offsets it reads past (:class:`ReportingPartitionRecords`)."""
    faust_adapter.use_fetch_records(LenientMemoryRecords)
    faust_adapter.use_partition_records(ReportingPartitionRecords)
