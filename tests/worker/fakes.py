"""A broker-free stand-in for confluent-kafka's Producer (the ``ProducerLike`` protocol).

It records every produced message, delivers the queued reports on ``poll``/``flush``
and remembers which flush each message went out with, so tests can check what was
made durable before what. Failures are injected per topic with ``fail``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message

from ktimers.wire import TimerEvent, decode_events, header_value

#: What a test plugs in as ``FakeProducer.fail``: the error to report for a record
#: produced to ``topic``, or None to deliver it.
FailFn = Callable[[str], KafkaError | None]

HeaderList = list[tuple[str, bytes | None]]
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def permanent_error() -> KafkaError:
    """A delivery error retrying cannot fix (the callback topic does not exist)."""
    return KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)


def transient_error() -> KafkaError:
    """A delivery error that may succeed next time (librdkafka gave up waiting)."""
    return KafkaError(KafkaError._MSG_TIMED_OUT)


@dataclass
class Sent:
    """One produced message and what became of it."""

    topic: str
    partition: int | None  # as given to produce(); None = let the partitioner choose
    key: bytes | None
    value: bytes | None
    headers: HeaderList
    flush_no: int  # how many flushes had happened when it was produced
    error: KafkaError | None = None
    offset: int | None = None  # set once delivered
    delivered: bool = False
    at_ms: int | None = None  # the producer's ``clock`` when it was produced (None: no clock given)

    def header(self, name: str) -> bytes | None:
        """Last value of header ``name`` (what a consumer reading headers by name sees)."""
        return header_value(self.headers, name)

    def header_names(self) -> list[str]:
        return [name for name, _ in self.headers]


class FakeMessage:
    """The parts of ``confluent_kafka.Message`` a delivery callback reads."""

    def __init__(self, sent: Sent, partition: int, error: KafkaError | None) -> None:
        self._sent = sent
        self._partition = partition
        self._error = error

    def topic(self) -> str:
        return self._sent.topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int | None:
        return self._sent.offset

    def key(self) -> bytes | None:
        return self._sent.key

    def value(self) -> bytes | None:
        return self._sent.value

    def headers(self) -> HeaderList:
        return list(self._sent.headers)

    def error(self) -> KafkaError | None:
        return self._error


class FakeProducer:
    """Records messages in ``sent``; delivers (or fails) them on ``poll``/``flush``."""

    def __init__(
        self, fail: FailFn | None = None, max_bytes: int | None = None, *, only_errors: bool = False
    ) -> None:
        self.fail: FailFn = fail or (lambda topic: None)
        #: As with ``delivery.report.only.error``: a delivered record's callback is not called.
        self.only_errors = only_errors
        #: librdkafka's message.max.bytes: produce() refuses larger records.
        self.max_bytes = max_bytes
        #: Errors raised by produce() itself, before queueing, as librdkafka does
        #: for a record larger than message.max.bytes.
        self.refuse: FailFn = lambda topic: None
        #: While set, no delivery report comes (a broker that does not answer yet).
        self.hold = False
        #: The records whose report does not come while this says so (the rest are delivered).
        self.hold_if: Callable[[Sent], bool] = lambda sent: False
        self.sent: list[Sent] = []
        self.flush_count = 0
        #: Stamps each record with the time it was produced (epoch ms), when set.
        self.clock: Callable[[], int] | None = None
        self._queue: list[tuple[Sent, DeliveryCallback | None]] = []
        self._next_offset: dict[tuple[str, int], int] = defaultdict(int)

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: DeliveryCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        on_delivery = callback or on_delivery
        refusal = self.refuse(topic)
        if refusal is not None:
            raise KafkaException(refusal)
        pairs = headers.items() if isinstance(headers, dict) else headers or ()
        for name, _ in pairs:
            name.encode()  # librdkafka cannot send a key that is not UTF-8 (confluent-kafka crashes)
        if self.max_bytes is not None:
            size = len(_bytes(key) or b"") + len(_bytes(value) or b"")
            size += sum(len(name.encode()) + len(_bytes(v) or b"") for name, v in pairs)
            if size > self.max_bytes:
                raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, f"{size} bytes"))
        sent = Sent(
            topic=topic,
            partition=None if partition == -1 else partition,
            key=_bytes(key),
            value=_bytes(value),
            headers=[(name, _bytes(v)) for name, v in pairs],
            flush_no=self.flush_count,
            at_ms=None if self.clock is None else self.clock(),
        )
        self.sent.append(sent)
        self._queue.append((sent, on_delivery))

    def _deliver(self) -> None:
        if self.hold:
            return
        queue, self._queue = self._queue, []
        for sent, on_delivery in queue:
            if self.hold_if(sent):
                self._queue.append((sent, on_delivery))
                continue
            partition = 0 if sent.partition is None else sent.partition
            err = self.fail(sent.topic)
            if err is None:
                tp = (sent.topic, partition)
                sent.offset = self._next_offset[tp]
                self._next_offset[tp] += 1
                sent.delivered = True
            else:
                sent.error = err
            if on_delivery is not None and not (err is None and self.only_errors):
                on_delivery(err, cast(Message, FakeMessage(sent, partition, err)))

    def poll(self, timeout: float = 0.0) -> int:
        self._deliver()
        return 0

    def flush(self, timeout: float = -1.0) -> int:
        self._deliver()
        self.flush_count += 1
        return 0

    def __len__(self) -> int:
        return len(self._queue)

    # -- what tests read ------------------------------------------------------

    def on(self, topic: str) -> list[Sent]:
        """Messages delivered to ``topic``, in produce order."""
        return [s for s in self.sent if s.topic == topic and s.delivered]

    def failed(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic and s.error is not None]

    def events(self, topic: str = "timer-events") -> list[TimerEvent]:
        """Delivered ``TimerEvent``s, decoded (batches into their events), in order."""
        return [event for s in self.on(topic) for event in decode_events(s.value, s.headers)]


class FakeTopics:
    """A ``TopicDirectory`` (futures/worker/destinations.py): every topic exists unless ``problems`` says."""

    def __init__(self) -> None:
        self.problems: dict[str, KafkaError] = {}
        self.asked: list[str] = []

    def problem(self, topic: str) -> KafkaError | None:
        self.asked.append(topic)
        return self.problems.get(topic)
