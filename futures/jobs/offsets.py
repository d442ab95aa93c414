"""Which offsets a job reads: planned on the driver from Kafka metadata, never from the data.

A job pins its offset ranges once, before it reads anything, so every action on
the same DataFrame sees the same records and the snapshot manifest can say
exactly what it covers.

The end of a partition is taken from a fetch response, not from ListOffsets: the
embedded Tansu broker answers ListOffsets with "first offset of the last batch
+ 1", which made a job miss a partition's last records (docs/PERFORMANCE.md#the-spark-jobs).
On a real cluster both
agree, so the fetch costs one small request per partition and changes nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ClusterMetadata

from futures.jobs.errors import SourceError
from ktimers.topics import kafka_reason, quiet

#: Kafka's sentinels in explicit offset maps, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1

#: librdkafka settings for every consumer of the jobs: no group membership, no
#: commits (offsets are the job's to choose), and short fetch waits (Tansu holds
#: a fetch for its whole wait even when data is there).
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 100,
    # The default of 1000 ms throttled a consumer on the embedded broker
    # (docs/PERFORMANCE.md#the-spark-jobs).
    "fetch.queue.backoff.ms": 10,
    # Records planned but deleted before a task reads them (retention) must fail the
    # read: librdkafka's default jumps to the end and the rest of the range looks empty,
    # which turns fired timers whose events were skipped into pending ones.
    "auto.offset.reset": "error",
}


def consumer_config(kafka: Mapping[str, Any]) -> dict[str, Any]:
    """Settings for a job consumer: ``kafka`` (connection) over :data:`CONSUMER_DEFAULTS`."""
    # group.id is required by librdkafka, though the consumer never joins the group.
    return {**CONSUMER_DEFAULTS, "group.id": f"kafka-timers-job-{uuid.uuid4().hex[:8]}", **kafka}


@dataclass(frozen=True)
class OffsetRange:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


@dataclass(frozen=True)
class OffsetSpec:
    """One end of what to read: ``earliest``, ``latest``, offsets per partition, or a time.

    ``offsets`` may hold :data:`EARLIEST`/:data:`LATEST`; partitions it does not
    name take ``default``. ``timestamp_ms`` is the first record at or after that
    time (epoch ms; on Tansu the broker's receive time).
    """

    default: int = EARLIEST
    offsets: Mapping[int, int] = field(default_factory=dict)
    timestamp_ms: int | None = None

    @classmethod
    def parse(cls, text: str | None, default: int) -> OffsetSpec:
        """``"earliest"``, ``"latest"`` or a JSON object ``{"0": 42, "1": -2}``."""
        if text is None or not text.strip():
            return cls(default=default)
        raw = text.strip()
        if raw.lower() in ("earliest", "latest"):
            return cls(default=EARLIEST if raw.lower() == "earliest" else LATEST)
        try:
            parsed = json.loads(raw)
            offsets = {int(p): int(o) for p, o in parsed.items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise SourceError(
                f"offsets {text!r}: use earliest, latest or JSON like "
                '{"0": 42, "1": -2} (partition -> offset; -2 earliest, -1 latest)'
            ) from exc
        if any(o < EARLIEST for o in offsets.values()):
            raise SourceError(f"offsets {text!r}: an offset must be >= 0, or -2 (earliest) / -1 (latest)")
        return cls(default=default, offsets=offsets)

    @classmethod
    def at_time(cls, timestamp_ms: int) -> OffsetSpec:
        return cls(timestamp_ms=timestamp_ms)

    def to_json(self, partitions: Sequence[int]) -> str:
        return json.dumps({str(p): self.offsets.get(p, self.default) for p in partitions})


class OffsetPlanner:
    """Kafka metadata for planning: partitions, true watermarks, offsets for times."""

    def __init__(self, kafka: Mapping[str, Any], timeout_s: float = 15.0) -> None:
        self._conf = consumer_config(kafka)
        self._timeout_s = timeout_s
        # Quiet: librdkafka logs every failed connection attempt, where the error raised here
        # says in one line what to check.
        self._consumer = Consumer(quiet(self._conf))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._consumer.close()

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions; :class:`SourceError` when it does not exist."""
        metadata = self._metadata()
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            raise SourceError(f"topic {topic!r} does not exist on {self._conf.get('bootstrap.servers')}")
        return sorted(info.partitions)

    def cluster_id(self) -> str:
        return str(self._metadata().cluster_id or "")

    def _metadata(self) -> ClusterMetadata:
        """The metadata of all topics (asking for one can auto-create it); :class:`SourceError`
        when the brokers do not answer."""
        try:
            return self._consumer.list_topics(timeout=self._timeout_s)
        except KafkaException as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: KafkaException) -> SourceError:
        return SourceError(
            f"cannot reach Kafka at {self._conf.get('bootstrap.servers')} within {self._timeout_s:g}s "
            f"({kafka_reason(exc)}). Check KAFKA_BOOTSTRAP_SERVERS, the KAFKA_* security settings and "
            "that the brokers are up"
        )

    def watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}``, high taken from a fetch response (see the module doc)."""
        marks = {}
        for partition in partitions:
            tp = TopicPartition(topic, partition)
            try:
                low, high = self._consumer.get_watermark_offsets(tp, timeout=self._timeout_s)
            except KafkaException as exc:
                raise self._unreachable(exc) from exc
            if high > low:
                high = self._fetched_high(topic, partition, high)
            marks[partition] = (low, high)
        return marks

    def _fetched_high(self, topic: str, partition: int, listed_high: int) -> int:
        self._consumer.assign([TopicPartition(topic, partition, listed_high - 1)])
        try:
            for msg in self._consumer.consume(1, timeout=self._timeout_s):
                err = msg.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise SourceError(f"{topic}[{partition}]: {err.str()}")
            _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        finally:
            self._consumer.unassign()
        return max(high, listed_high)

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        """Timestamp (epoch ms) of the record at ``offset``, or the first after it; None if none."""
        self._consumer.assign([TopicPartition(topic, partition, offset)])
        try:
            for msg in self._consumer.consume(1, timeout=self._timeout_s):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return None
                    raise SourceError(f"{topic}[{partition}] at offset {offset}: {err.str()}")
                kind, ms = msg.timestamp()
                return ms if kind and ms >= 0 else None
        finally:
            self._consumer.unassign()
        return None

    def offsets_for_time(self, topic: str, partitions: Sequence[int], timestamp_ms: int) -> dict[int, int]:
        """First offset at or after ``timestamp_ms`` per partition; :data:`LATEST` when none is."""
        query = [TopicPartition(topic, p, timestamp_ms) for p in partitions]
        found = self._consumer.offsets_for_times(query, timeout=self._timeout_s)
        return {tp.partition: (tp.offset if tp.offset >= 0 else LATEST) for tp in found}

    def ranges(self, topic: str, start: OffsetSpec, end: OffsetSpec) -> list[OffsetRange]:
        """One range per partition, within the partition's watermarks."""
        partitions = self.partitions(topic)
        marks = self.watermarks(topic, partitions)
        starts = self._resolve(topic, partitions, marks, start)
        ends = self._resolve(topic, partitions, marks, end)
        return [OffsetRange(topic, p, starts[p], max(ends[p], starts[p])) for p in partitions]

    def _resolve(
        self, topic: str, partitions: Sequence[int], marks: Mapping[int, tuple[int, int]], spec: OffsetSpec
    ) -> dict[int, int]:
        if spec.timestamp_ms is not None:
            wanted = self.offsets_for_time(topic, partitions, spec.timestamp_ms)
        else:
            wanted = {p: spec.offsets.get(p, spec.default) for p in partitions}
        resolved = {}
        for p in partitions:
            low, high = marks[p]
            offset = wanted[p]
            if offset == EARLIEST:
                offset = low
            elif offset == LATEST:
                offset = high
            resolved[p] = min(max(offset, low), high)
        return resolved


def split(ranges: Sequence[OffsetRange], max_records: int) -> Iterator[OffsetRange]:
    """Cut ranges into pieces of at most ``max_records`` (0: no cut), for more Spark tasks."""
    for r in ranges:
        if max_records <= 0 or r.size <= max_records:
            yield r
            continue
        for start in range(r.start, r.end, max_records):
            yield OffsetRange(r.topic, r.partition, start, min(start + max_records, r.end))
