"""Reading back request records the stream skipped (and changelog ranges, :mod:`futures.worker.restate`).

Faust acks — without delivering — records its stream fetched while flow
control was off or under an older consumer generation (a rebalance in
progress), and may then read on past them. For a timer service a request
that is never applied is a lost timer. The engine notices the hole (a
record's offset is more than one past the last applied offset of its
partition) and reads the missing range here, directly, before it goes on.

Plain producers leave no holes; transactional ones do, that hold no request:
each commit or abort writes a marker that takes an offset, and the records of
an aborted transaction are not delivered. The consumer reports the offsets it
read past without a record (:class:`ReadPast`, :mod:`futures.worker.passed`);
a hole it read past entirely is not read back. Both paths read only committed
transactions: the consumer ``read_committed`` (:mod:`futures.worker.transport`),
the reader here with librdkafka's ``isolation.level`` set the same.

A read returns the whole hole or raises :class:`GapReadError`: the engine
moves progress past the hole once it has the records, so a partial answer
would lose the rest for good, while an error stops the worker and a restart
reads the hole again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol, cast

from confluent_kafka import OFFSET_INVALID, Consumer, Message, TopicPartition

from futures.ingress.records import SourceRecord
from ktimers.config import KafkaConfig
from ktimers.errors import TimersError
from ktimers.wire import message_headers

log = logging.getLogger(__name__)

#: How long one attempt at reading a hole may take (s).
READ_TIMEOUT_S = 15.0
#: Attempts at reading a hole before :class:`GapReadError`; each resumes where the last stopped.
READ_ATTEMPTS = 3
#: One poll of the reader's consumer (s): how often it checks its position and the deadline.
_POLL_S = 0.2


class GapReadError(TimersError):
    """A hole in a partition's offsets could not be read back completely; the worker must stop."""


class ReadPast(Protocol):
    def holds_no_request(self, topic: str, partition: int, start: int, end: int) -> bool:
        """Whether the consumer read past every offset of ``topic[partition]`` from ``start`` to
        ``end - 1`` and found no record to deliver there (transaction markers, records of
        aborted transactions). False when it does not know."""
        ...


class GapReader(Protocol):
    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """Every record of ``topic[partition]`` with ``start <= offset < end``.

        Offsets that hold no record (transaction markers, compacted records) are
        simply absent; raises :class:`GapReadError` when the range could not be
        read to its end.
        """
        ...


class KafkaGapReader:
    """A consumer that is assigned, never subscribed: no group, no commits.

    A hole is read completely when a record at or past ``end`` arrives, or when
    the consumer's position reaches ``end``: librdkafka moves the position past
    transaction markers it does not deliver, where waiting for the offset
    itself would wait forever. The end of the partition is never taken from
    ListOffsets, which under-reports it on the embedded broker.
    """

    def __init__(
        self, kafka: KafkaConfig, *, timeout_s: float = READ_TIMEOUT_S, attempts: int = READ_ATTEMPTS
    ) -> None:
        if timeout_s <= 0 or attempts < 1:
            raise ValueError("timeout_s must be > 0 and attempts >= 1")
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._consumer = Consumer(
            {
                **kafka.librdkafka(),
                "group.id": "kafka-timers-gap-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                # Records below the log start are gone (retention): read from what is left.
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
                # As the worker's consumer reads: a request of an aborted transaction never applies.
                "isolation.level": "read_committed",
            }
        )

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """Every record of ``topic[partition]`` with ``start <= offset < end``, or :class:`GapReadError`.

        Waits up to ``attempts`` × ``timeout_s`` seconds, off the event loop.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._read, topic, partition, start, end)

    def _read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        found: dict[int, SourceRecord] = {}
        errors: list[str] = []  # the last consumer error
        resume = start
        for attempt in range(1, self._attempts + 1):
            done, resume = self._read_once(topic, partition, resume, end, found, errors)
            if done:
                return [found[offset] for offset in sorted(found)]
            if attempt < self._attempts:
                log.warning(
                    "%s[%d]: offsets %d..%d not read back within %.1fs (attempt %d of %d, at offset %d); "
                    "trying again",
                    topic, partition, start, end - 1, self._timeout_s, attempt, self._attempts, resume,
                )  # fmt: skip
        _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        last_error = f"; last error: {errors[-1]}" if errors else ""
        raise GapReadError(
            f"{topic}[{partition}]: offsets {start}..{end - 1} could not be read back ({len(found)} "
            f"record(s) read, stopped at offset {resume}; broker high watermark {high}) in "
            f"{self._attempts} attempt(s) of {self._timeout_s:.1f}s{last_error}. The worker stops so that "
            "it does not move past records it never read (requests it never applied, or changelog records "
            "to restate): check the broker, then restart it (it reads the range again)."
        )

    def _read_once(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        found: dict[int, SourceRecord],
        errors: list[str],
    ) -> tuple[bool, int]:
        """Read from ``start`` into ``found``: (whether ``end`` was reached, the next offset to read)."""
        where = TopicPartition(topic, partition)
        self._consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + self._timeout_s
        position = start
        try:
            while True:
                msg = self._consumer.poll(_POLL_S)
                if msg is not None:
                    err = msg.error()
                    if err is not None:
                        errors[:] = [err.str()]  # the last one, for the error message
                    else:
                        offset = cast(int, msg.offset())
                        if offset >= end:
                            return True, end  # the rest of the hole held no records
                        if offset >= start:
                            found[offset] = _source_record(topic, partition, msg)
                        position = max(position, offset + 1)
                # Past what was delivered: librdkafka skipped transaction markers up to here.
                [current] = self._consumer.position([where])
                if current.offset != OFFSET_INVALID:
                    position = max(position, current.offset)
                if position >= end:
                    return True, end
                if time.monotonic() >= deadline:
                    return False, position
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


def _source_record(topic: str, partition: int, msg: Message) -> SourceRecord:
    headers = message_headers(msg)
    if headers is None:
        # Its headers are lost to this client: the record is judged without them
        # (a format that needs a header rejects it), rather than stop the worker on it.
        log.warning(
            "%s[%d]@%s read back without its headers: a header key is not UTF-8",
            topic,
            partition,
            msg.offset(),
        )
        headers = ()
    return SourceRecord(
        topic=topic,
        partition=partition,
        offset=cast(int, msg.offset()),
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        timestamp_ms=msg.timestamp()[1],
    )
