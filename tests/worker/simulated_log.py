"""A request partition's log as Kafka serves it — transactions, markers, aborted batches —
read by aiokafka's own fetch code, without a broker.

The embedded broker shows aborted records even to ``read_committed`` consumers, so what a
real broker does is simulated here: :class:`SimulatedLog` holds record batches as Kafka
writes them (a transaction's batches, then its commit or abort marker, each at its own
offset) and answers a fetch as a broker does, with the batches from the fetch offset on and
the aborted transactions among them. :class:`SimulatedFetcher` stands where Faust's consumer
thread expects aiokafka's consumer: each fetch is read by aiokafka's ``PartitionRecords``
(the module's, so the worker's replacement too) and handed out by its ``FetchResult``, which
moves the partition's position in a real aiokafka assignment, at the isolation level the
worker set on its aiokafka consumer.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

_CONTROL = 0x20
_ATTRIBUTES_AT = struct.calcsize(">qiibI")
_CRC_AT = struct.calcsize(">qiib")


def _batch(
    base: int, values: Sequence[bytes], timestamp_ms: int, producer_id: int, control: int | None
) -> bytes:
    transactional = producer_id >= 0
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(transactional), producer_id=producer_id,
        producer_epoch=0 if transactional else -1, base_sequence=0 if transactional else -1,
        batch_size=1 << 20,
    )  # fmt: skip
    if control is None:
        for i, value in enumerate(values):
            builder.append(i, timestamp=timestamp_ms, key=None, value=value, headers=[])
    else:  # a marker: key = version, type (0 abort, 1 commit); value = version, coordinator epoch
        key, value = struct.pack(">hh", 0, control), struct.pack(">hi", 0, 0)
        builder.append(0, timestamp=timestamp_ms, key=key, value=value, headers=[])
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)  # the broker assigns the offsets
    if control is not None:
        attributes = struct.unpack_from(">h", raw, _ATTRIBUTES_AT)[0] | _CONTROL
        struct.pack_into(">h", raw, _ATTRIBUTES_AT, attributes)
        struct.pack_into(">I", raw, _CRC_AT, calc_crc32c(bytes(raw[_ATTRIBUTES_AT:])))
    return bytes(raw)


@dataclass
class _Stored:
    base: int
    end: int
    raw: bytes


@dataclass
class SimulatedLog:
    """One partition's log."""

    batches: list[_Stored] = field(default_factory=list)
    #: (producer id, first offset) of every aborted transaction, as the broker's index has them.
    aborted: list[tuple[int, int]] = field(default_factory=list)
    end: int = 0
    #: Producer id → first offset of its open transaction.
    _open: dict[int, int] = field(default_factory=dict)

    def _append(
        self, values: Sequence[bytes], timestamp_ms: int, producer_id: int, control: int | None
    ) -> list[int]:
        base = self.end
        count = 1 if control is not None else len(values)
        self.batches.append(
            _Stored(base, base + count, _batch(base, values, timestamp_ms, producer_id, control))
        )
        self.end += count
        return list(range(base, base + count))

    def write(self, values: Sequence[bytes], timestamp_ms: int = 1_000) -> list[int]:
        """A batch of a plain producer; its offsets."""
        return self._append(values, timestamp_ms, -1, None)

    def write_in_transaction(
        self, producer_id: int, values: Sequence[bytes], timestamp_ms: int = 1_000
    ) -> list[int]:
        """A batch of ``producer_id``'s transaction (begun by its first batch); its offsets."""
        offsets = self._append(values, timestamp_ms, producer_id, None)
        self._open.setdefault(producer_id, offsets[0])
        return offsets

    def end_transaction(self, producer_id: int, *, commit: bool, timestamp_ms: int = 1_000) -> int:
        """The marker of ``producer_id``'s transaction; its offset."""
        first = self._open.pop(producer_id)
        if not commit:
            self.aborted.append((producer_id, first))
        [offset] = self._append([], timestamp_ms, producer_id, 1 if commit else 0)
        return offset

    def fetch(self, offset: int, max_batches: int) -> tuple[bytes, list[tuple[int, int]]]:
        """What a fetch at ``offset`` returns: the bytes of the batches from the one holding it
        on, and the aborted transactions that may have batches among them."""
        served = [b for b in self.batches if b.end > offset][:max_batches]
        if not served:
            return b"", []
        last = served[-1].end
        aborted = [(pid, first) for pid, first in self.aborted if first < last]
        return b"".join(b.raw for b in served), aborted


class SimulatedFetcher:
    """What Faust's consumer thread reads from: aiokafka's consumer, its fetcher and their state.

    Each call of ``fetched_records`` fetches every asked partition at its position
    (``max_batches`` batches), hands the records out through aiokafka's ``PartitionRecords``
    and ``FetchResult``, then runs ``handed_out`` (what happens before they reach Faust's consumer).
    """

    def __init__(
        self, consumer: AIOKafkaConsumer, logs: dict[TopicPartition, SimulatedLog], max_batches: int = 4
    ) -> None:
        self.consumer = consumer
        self.logs = logs
        self.max_batches = max_batches
        self.handed_out: Callable[[], None] = lambda: None
        consumer.assign(list(logs))
        for tp in logs:
            self.state(tp).seek(0)
        self._closed = False
        self._fetcher = self
        self._subscriptions = SimpleNamespace(fetch_context=contextlib.nullcontext)

    def state(self, tp: TopicPartition) -> Any:
        return self.consumer._subscription.subscription.assignment.state_value(tp)

    def position(self, tp: TopicPartition) -> int:
        return int(self.state(tp).position)

    async def fetched_records(
        self, partitions: set[Any], timeout: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]:
        assignment = self.consumer._subscription.subscription.assignment
        isolation = {"read_committed": fetcher.READ_COMMITTED, "read_uncommitted": fetcher.READ_UNCOMMITTED}[
            self.consumer._isolation_level
        ]
        drained = {}
        for tp, log in self.logs.items():
            if tp not in partitions:
                continue
            state = self.state(tp)
            data, aborted = log.fetch(state.position, self.max_batches)
            if not data:
                continue
            state.highwater, state.timestamp = log.end, 9_000
            records = fetcher.PartitionRecords(
                tp, fetcher.MemoryRecords(data), aborted, state.position, None, None, True, isolation
            )
            result = fetcher.FetchResult(tp, assignment=assignment, partition_records=records, backoff=0)
            handed = result.getall(max_records)
            if handed:
                drained[tp] = handed
        self.handed_out()
        return drained
