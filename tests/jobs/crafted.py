"""Request and event logs written by hand, as Kafka rows, for the pure transforms."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession

from futures.jobs.kafka_source import SOURCE_SCHEMA
from ktimers.wire import (
    KIND_BATCH,
    KIND_CANCEL,
    KIND_HEADER,
    Cancel,
    FiredTimers,
    Future,
    ScheduledTimers,
    TimerEvent,
    TimerEventBatch,
    event_batch_key,
)

REQUEST = "timer-request"
EVENTS = "timer-events"
T0 = 1_795_000_000_000  # epoch ms of the first record

Kind = TimerEvent.Kind


@dataclass
class Log:
    """A topic being written: every append returns the record's offset in its partition."""

    topic: str = REQUEST
    rows: list[tuple] = field(default_factory=list)
    _next: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def append(
        self,
        partition: int,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
    ) -> int:
        offset = self._next[partition]
        self._next[partition] += 1
        ts = T0 + len(self.rows) if timestamp_ms is None else timestamp_ms
        hdrs = [{"key": k, "value": v} for k, v in headers or []]
        when = datetime.fromtimestamp(ts / 1000, UTC)
        self.rows.append((key, value, self.topic, partition, offset, when, hdrs))
        return offset

    def schedule(
        self,
        partition: int,
        timer_id: str,
        due_ms: int,
        payload: bytes = b"x",
        topic: str = "cb",
        timestamp_ms: int | None = None,
    ) -> int:
        future = Future(
            callBackTopic=topic, callBackKey=f"k-{timer_id}", callBack=payload, id=timer_id, due_ms=due_ms
        )
        return self.append(
            partition, future.SerializeToString(), timer_id.encode(), timestamp_ms=timestamp_ms
        )

    def seed(self, partition: int, second: int, payload: bytes = b"seed", topic: str = "cb") -> int:
        """The original seed format: a bare Future keyed by the due epoch second, no id."""
        future = Future(callBackTopic=topic, callBackKey="s", callBack=payload)
        return self.append(partition, future.SerializeToString(), str(second).encode())

    def cancel(self, partition: int, timer_id: str) -> int:
        value = Cancel(id=timer_id).SerializeToString()
        return self.append(partition, value, timer_id.encode(), [(KIND_HEADER, KIND_CANCEL)])

    def df(self, spark: SparkSession) -> DataFrame:
        return spark.createDataFrame(self.rows, SOURCE_SCHEMA)


@dataclass
class Events:
    """`timer-events` as the worker writes it (``TimerEventBatch`` records of ``batch_size``
    events per partition) or, with ``batch_size=0``, as workers before batches did (a record each)."""

    log: Log = field(default_factory=lambda: Log(EVENTS))
    batch_size: int = 0
    _open: dict[int, list[TimerEvent]] = field(default_factory=lambda: defaultdict(list))

    def add(
        self, kind: int, partition: int, timer_id: str, offset: int = -1, due_ms: int = 0, reason: str = ""
    ) -> None:
        event = TimerEvent(
            id=timer_id,
            kind=kind,
            partition=partition,
            source_offset=offset,
            due_ms=due_ms,
            at_ms=T0,
            reason=reason,
        )
        if not self.batch_size:
            self.log.append(partition, event.SerializeToString(), timer_id.encode())
            return
        batch = self._open[partition]
        batch.append(event)
        if len(batch) >= self.batch_size:
            self.close()

    def close(self) -> None:
        """Write the open batches."""
        for partition, events in self._open.items():
            if events:
                # FIRED events in columns, after the others, and runs of SCHEDULED ones in columns
                # at their place among the others, as the worker writes them.
                fired = [e for e in events if e.kind == TimerEvent.FIRED]
                block = FiredTimers(
                    id=[e.id for e in fired],
                    due_ms=[e.due_ms for e in fired],
                    source_offset=[e.source_offset for e in fired],
                    at_ms=T0,
                    partition=partition,
                )
                others: list[TimerEvent] = []
                runs: list[ScheduledTimers] = []
                run: ScheduledTimers | None = None
                for e in events:
                    if e.kind == TimerEvent.FIRED:
                        continue
                    if e.kind != TimerEvent.SCHEDULED or e.reason:
                        others.append(e)
                        run = None
                        continue
                    if run is None:
                        run = ScheduledTimers(at_ms=e.at_ms, partition=partition, at_event=len(others))
                        runs.append(run)
                    run.id.append(e.id)
                    run.due_ms.append(e.due_ms)
                    run.source_offset.append(e.source_offset)
                    run.callback_topic.append(e.callback_topic)
                value = TimerEventBatch(
                    events=others, scheduled=runs, fired=[block] if fired else []
                ).SerializeToString()
                self.log.append(partition, value, event_batch_key(partition), [(KIND_HEADER, KIND_BATCH)])
        self._open.clear()

    def df(self, spark: SparkSession) -> DataFrame:
        return self.log.df(spark)
