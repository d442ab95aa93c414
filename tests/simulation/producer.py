"""librdkafka's producer as the engine sees it (``ProducerLike``), writing into the simulated log.

A produced record reaches the broker after a latency the world chooses (records of one partition
in the order they were produced: an idempotent producer), whether or not anyone polls; its
delivery report is served by the next ``poll`` or ``flush``. A crash (:meth:`SimProducer.crash`)
delivers a prefix of each partition's records still on their way, and loses the rest.

Not modelled: delivery failures and retries (the engine's handling of those has tests of its
own), buffer limits, the partitioner (a record without a partition goes to partition 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.simulation.kafka import LogRecord, SimKafka


class SimCrash(Exception):
    """The worker is dead: nothing it does from now on reaches the world."""


@dataclass
class _InFlight:
    topic: str
    partition: int
    record: LogRecord
    arrival_ms: int
    callback: Callable[..., Any] | None
    arrived: bool = False


class SimMessage:
    """The parts of ``confluent_kafka.Message`` a delivery callback reads."""

    def __init__(self, topic: str, partition: int, record: LogRecord) -> None:
        self._topic, self._partition, self._record = topic, partition, record

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._record.offset

    def key(self) -> bytes | None:
        return self._record.key

    def value(self) -> bytes | None:
        return self._record.value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._record.headers)

    def error(self) -> None:
        return None


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


class SimProducer:
    """One of a worker's producers. ``host`` says whether the worker lives, what its clock reads,
    the world's time and latency, and counts its writes (a crash may be armed on one)."""

    def __init__(self, kafka: SimKafka, host: ProducerHost) -> None:
        self._kafka = kafka
        self._host = host
        self._queue: list[_InFlight] = []
        self._last_arrival: dict[tuple[str, int], int] = {}

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callable[..., Any] | None = None,
        on_delivery: Callable[..., Any] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        host = self._host
        host.write()  # raises SimCrash once the worker is dead (or dies at this write)
        partition = 0 if partition < 0 else partition
        pairs = headers.items() if isinstance(headers, dict) else headers or ()
        now = host.now_ms()
        record = LogRecord(
            0,
            _bytes(key),
            _bytes(value),
            tuple((n, _bytes(v)) for n, v in pairs),
            now,
            host.name,
            host.clock_ms(),
        )
        tp = (topic, partition)
        arrival = max(now + host.latency_ms(), self._last_arrival.get(tp, 0))
        self._last_arrival[tp] = arrival
        self._queue.append(_InFlight(topic, partition, record, arrival, callback or on_delivery))

    def arrive(self) -> None:
        """Records whose latency has passed reach the broker (the world calls this as time moves)."""
        if self._host.dead:
            return
        now = self._host.now_ms()
        for item in self._queue:
            if not item.arrived and item.arrival_ms <= now:
                self._kafka.append(item.topic, item.partition, item.record)
                item.arrived = True

    def poll(self, timeout: float = 0.0) -> int:
        if self._host.dead:
            raise SimCrash(self._host.name)
        self.arrive()
        served = [item for item in self._queue if item.arrived]
        self._queue = [item for item in self._queue if not item.arrived]
        for item in served:
            if item.callback is not None:
                item.callback(None, SimMessage(item.topic, item.partition, item.record))
        return len(served)

    def flush(self, timeout: float = -1.0) -> int:
        self.poll(0)
        return len(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def list_topics(self, topic: str | None = None, timeout: float = -1.0) -> Any:
        raise NotImplementedError("the simulated engine writes only to topics it is given")

    def crash(self, delivered_share: float) -> None:
        """The process dies: of each partition's records on their way, the first ``delivered_share``
        reach the broker (already sent), the rest are lost."""
        by_tp: dict[tuple[str, int], list[_InFlight]] = {}
        for item in self._queue:
            if not item.arrived:
                by_tp.setdefault((item.topic, item.partition), []).append(item)
        for (topic, partition), items in sorted(by_tp.items()):
            for item in items[: int(len(items) * delivered_share)]:
                self._kafka.append(topic, partition, item.record)
        self._queue = []


class ProducerHost:
    """What a producer asks of the worker that owns it (implemented by the worker)."""

    name: str
    dead: bool

    def write(self) -> None:
        """A durable write is about to happen (raises :class:`SimCrash` if the worker is dead)."""
        raise NotImplementedError

    def now_ms(self) -> int:
        raise NotImplementedError

    def clock_ms(self) -> int:
        raise NotImplementedError

    def latency_ms(self) -> int:
        raise NotImplementedError
