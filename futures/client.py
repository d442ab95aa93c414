"""Client library: schedule and cancel durable timers from any Python service.

Needs only confluent-kafka and protobuf (never Faust). A timer is one ``Future``
record on the request topic, keyed by the timer id so that a cancel or a
reschedule by the same id lands in the same partition as the timer it names::

    with TimerClient() as timers:
        handle = timers.schedule("orders", "order-42", b"remind", delay=3600)
        ...
        timers.cancel(handle)

Times: ``at`` and ``delay`` are in **seconds** (or ``datetime``/``timedelta``);
everything on the wire and in :class:`TimerHandle` is epoch **milliseconds**.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Protocol, Self

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import ClusterMetadata

from futures.partitioner import PartitionFn, partitioner_for
from ktimers.config import CommonConfig
from ktimers.errors import ConfigError, DeliveryError, TimersError
from ktimers.wire import (
    KIND_BATCH,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    Cancel,
    Future,
    FutureBatch,
    Header,
)

__all__ = [
    "AsyncTimerClient",
    "Clock",
    "HeadersArg",
    "ProducerLike",
    "TimerClient",
    "TimerHandle",
    "TimerRecord",
    "TimerSpec",
    "When",
    "build_batches",
    "build_cancel",
    "build_schedule",
    "due_ms_for",
    "producer_config_for",
]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Returns the current time in epoch seconds (``time.time``)."""

HeadersArg = Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]
When = datetime | timedelta | float
"""``send_later``'s due time: an aware datetime or epoch seconds (absolute), or a timedelta (relative)."""
RecordHeaders = list[tuple[str, str | bytes | None]]
DeliveryCallback = Callable[[KafkaError | None, Message], None]

# The worker writes these on callback records; a user header with this prefix
# could spoof one (a fake kt-token would defeat a TokenGuard), so they are refused.
RESERVED_HEADER_PREFIX = "kt-"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


class ProducerLike(Protocol):
    """What the clients need of a confluent-kafka ``Producer``; tests pass a fake."""

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        *,
        on_delivery: DeliveryCallback | None = None,
        headers: RecordHeaders | None = None,
        partition: int = -1,
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata: ...


@dataclass(frozen=True)
class TimerHandle:
    """A scheduled timer: everything needed to cancel it or recognise its callback.

    ``due_ms`` is epoch milliseconds. ``record_key`` is the key of the request
    record; a cancel must use the same one to reach the same partition.
    """

    id: str
    record_key: bytes
    due_ms: int
    callback_topic: str
    token: str | None = None

    @property
    def due(self) -> datetime:
        """The due time as an aware UTC datetime."""
        return _EPOCH + self.due_ms * _MS


@dataclass(frozen=True)
class TimerRecord:
    """One record for the request topic, for callers that produce it themselves
    (e.g. inside their own Kafka transaction)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: RecordHeaders
    #: Explicit partition (batches: the partition of every timer in it); None lets the partitioner pick.
    partition: int | None = None


@dataclass(frozen=True)
class TimerSpec:
    """One timer for :meth:`TimerClient.schedule_many`: the arguments of ``schedule``."""

    topic: str
    key: str | bytes
    payload: str | bytes
    at: datetime | float | None = None
    delay: float | timedelta | None = None
    id: str | None = None
    token: str | None = None
    headers: HeadersArg | None = None


def due_ms_for(*, at: datetime | float | None, delay: float | timedelta | None, now: float) -> int:
    """Epoch milliseconds of the due time from exactly one of ``at`` and ``delay``.

    ``at``: an aware ``datetime`` or epoch seconds. ``delay``: seconds or a
    ``timedelta``, at least 0, counted from ``now`` (epoch seconds). A due time in
    the past is allowed: the timer fires on the worker's next tick.
    """
    if (at is None) == (delay is None):
        raise ValueError(
            "give exactly one of at= (epoch seconds or an aware datetime) "
            "or delay= (seconds >= 0 or a timedelta)"
        )
    if at is not None:
        if isinstance(at, datetime):
            if at.tzinfo is None or at.utcoffset() is None:
                raise ValueError(
                    "at= is a naive datetime: give an aware one, e.g. datetime.now(timezone.utc)"
                )
            return (at - _EPOCH) // _MS
        return round(_finite_seconds("at", at) * 1000)
    assert delay is not None  # noqa: S101 - narrowed by the exactly-one check above
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else _finite_seconds("delay", delay)
    if seconds < 0:
        raise ValueError(f"delay={delay!r} is negative: a delay must be >= 0 seconds")
    return round((now + seconds) * 1000)


def _finite_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r}: expected a number of seconds")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a finite number of seconds")
    return float(value)


def _utf8(name: str, value: str | bytes) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"{name} must be str or bytes, not {type(value).__name__}")


def _text(name: str, value: str | bytes) -> str:
    if isinstance(value, str):
        return value
    try:
        return _utf8(name, value).decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} must be UTF-8 text (the wire field is a string)") from exc


def _user_headers(headers: HeadersArg | None) -> list[Header]:
    if headers is None:
        return []
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in pairs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"header name {name!r} must be a non-empty str")
        if name.startswith(RESERVED_HEADER_PREFIX):
            raise ValueError(f"header {name!r}: names starting with {RESERVED_HEADER_PREFIX!r} are reserved")
        out.append(Header(key=name, value=_utf8(f"header {name!r}", value)))
    return out


def build_schedule(
    common: CommonConfig,
    topic: str,
    key: str | bytes,
    payload: str | bytes,
    *,
    at: datetime | float | None,
    delay: float | timedelta | None,
    id: str | None,
    token: str | None,
    headers: HeadersArg | None,
    now: float,
) -> tuple[TimerRecord, TimerHandle]:
    """The request record for one timer, and its handle. ``now`` is epoch seconds."""
    future, handle = _future(
        common, topic, key, payload, at=at, delay=delay, id=id, token=token, headers=headers, now=now
    )
    record = TimerRecord(
        topic=common.topics.request,
        key=handle.record_key,
        value=future.SerializeToString(),
        headers=[(KIND_HEADER, KIND_FUTURE)],
    )
    return record, handle


def _future(
    common: CommonConfig,
    topic: str,
    key: str | bytes,
    payload: str | bytes,
    *,
    at: datetime | float | None,
    delay: float | timedelta | None,
    id: str | None,
    token: str | None,
    headers: HeadersArg | None,
    now: float,
) -> tuple[Future, TimerHandle]:
    if not isinstance(topic, str) or not topic:
        raise ValueError("topic must be the non-empty name of the topic the callback goes to")
    if topic in common.topics.own:
        raise ValueError(
            f"topic {topic!r} is one of the timer service's own topics: it cannot receive callbacks"
        )
    if id is not None and (not isinstance(id, str) or not id):
        raise ValueError("id must be a non-empty str (or None for a generated one)")
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError("token must be a non-empty str (or None)")
    due_ms = due_ms_for(at=at, delay=delay, now=now)
    timer_id = id or uuid.uuid4().hex
    future = Future(
        callBackTopic=topic,
        callBackKey=_text("key", key),
        callBack=_utf8("payload", payload),
        id=timer_id,
        due_ms=due_ms,
        token=token or "",
        headers=_user_headers(headers),
    )
    record_key = timer_id.encode()
    handle = TimerHandle(id=timer_id, record_key=record_key, due_ms=due_ms, callback_topic=topic, token=token)
    return future, handle


#: Timers per batch record by default, and the most bytes a batch record may
#: reach (under Kafka's default 1 MB message.max.bytes, with room for headers).
BATCH_SIZE = 1000
MAX_BATCH_BYTES = 900_000


def build_batches(
    common: CommonConfig,
    timers: Iterable[TimerSpec],
    *,
    partitions: int,
    partition_of: PartitionFn,
    now: float,
    batch_size: int = BATCH_SIZE,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> tuple[list[TimerRecord], list[TimerHandle]]:
    """``FutureBatch`` records for many timers, and their handles in the order given.

    Every timer goes in a batch for the partition its id would be produced to
    (``partition_of(id, partitions)``), so that a cancel or a replacement keyed
    by the id reaches the partition that holds it. ``now`` is epoch seconds.
    """
    if batch_size < 1 or max_batch_bytes < 1:
        raise ValueError("batch_size and max_batch_bytes must be >= 1")
    handles: list[TimerHandle] = []
    groups: dict[int, list[Future]] = {}
    for spec in timers:
        if not isinstance(spec, TimerSpec):
            raise ValueError(f"schedule_many takes TimerSpec items, not {type(spec).__name__}")
        future, handle = _future(
            common,
            spec.topic,
            spec.key,
            spec.payload,
            at=spec.at,
            delay=spec.delay,
            id=spec.id,
            token=spec.token,
            headers=spec.headers,
            now=now,
        )
        handles.append(handle)
        groups.setdefault(partition_of(handle.record_key, partitions), []).append(future)
    records = []
    for partition, futures in sorted(groups.items()):
        for chunk in _chunks(futures, batch_size, max_batch_bytes):
            records.append(
                TimerRecord(
                    topic=common.topics.request,
                    key=None,
                    value=FutureBatch(futures=chunk).SerializeToString(),
                    headers=[(KIND_HEADER, KIND_BATCH)],
                    partition=partition,
                )
            )
    return records, handles


def _chunks(futures: Sequence[Future], max_count: int, max_bytes: int) -> Iterable[list[Future]]:
    chunk: list[Future] = []
    size = 0
    for future in futures:
        # Each element costs its size plus a tag and a length prefix (<= 6 bytes).
        cost = future.ByteSize() + 6
        if chunk and (len(chunk) >= max_count or size + cost > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(future)
        size += cost
    if chunk:
        yield chunk


def due_for(when: When) -> dict[str, Any]:
    """``send_later``'s ``when`` as ``schedule``'s keyword: ``at`` (absolute) or ``delay`` (relative)."""
    if isinstance(when, timedelta):
        return {"delay": when}
    if isinstance(when, datetime | int | float) and not isinstance(when, bool):
        return {"at": when}
    raise ValueError(
        f"when={when!r}: give an aware datetime or epoch seconds (absolute), or a timedelta (relative)"
    )


def build_cancel(
    common: CommonConfig, handle_or_id: TimerHandle | str, record_key: str | bytes | None
) -> tuple[TimerRecord, str]:
    """The cancel record for a timer, and the timer id it names."""
    if isinstance(handle_or_id, TimerHandle):
        timer_id, default_key = handle_or_id.id, handle_or_id.record_key
    elif isinstance(handle_or_id, str) and handle_or_id:
        timer_id, default_key = handle_or_id, handle_or_id.encode()
    else:
        raise ValueError("cancel() takes a TimerHandle or a non-empty timer id")
    key = default_key if record_key is None else _utf8("record_key", record_key)
    record = TimerRecord(
        topic=common.topics.request,
        key=key,
        value=Cancel(id=timer_id).SerializeToString(),
        headers=[(KIND_HEADER, KIND_CANCEL)],
    )
    return record, timer_id


def producer_config_for(common: CommonConfig, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """librdkafka settings for the clients: idempotent, ``acks=all``, then ``overrides``."""
    conf: dict[str, Any] = {
        **common.kafka.librdkafka(),
        "enable.idempotence": True,
        "acks": "all",
        # Timers are small and often scheduled in bursts; a short linger batches them.
        "linger.ms": 5,
        "client.id": "kafka-timers-client",
    }
    conf.update(overrides or {})
    return conf


def _make_producer(conf: dict[str, Any]) -> ProducerLike:
    try:
        return Producer(conf)
    except KafkaException as exc:
        raise ConfigError(f"invalid producer configuration: {exc}") from exc


class _Reporter:
    """Turns delivery reports into one DeliveryError and remembers broker errors.

    Callbacks run on whichever thread polls the producer, hence the lock.
    """

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._lock = threading.Lock()
        self._first: DeliveryError | None = None
        self._more = 0
        self.last_broker_error: str | None = None

    def on_error(self, err: KafkaError) -> None:
        # librdkafka reports connection trouble here (it keeps retrying); the text
        # makes a later delivery timeout explain itself.
        self.last_broker_error = err.str()

    def error_for(self, what: str, err: KafkaError) -> DeliveryError:
        detail = f"{what} was not delivered to Kafka at {self._bootstrap}: {err.str()}"
        if err.code() == KafkaError._MSG_TIMED_OUT and self.last_broker_error:
            detail += f" (last broker error: {self.last_broker_error})"
        exc = DeliveryError(detail)
        exc.__cause__ = KafkaException(err)
        return exc

    def keep(self, exc: DeliveryError) -> None:
        with self._lock:
            if self._first is None:
                self._first = exc
            else:
                self._more += 1

    def raise_pending(self) -> None:
        """Raise the first kept error (once), naming how many more failed since."""
        with self._lock:
            first, more = self._first, self._more
            self._first, self._more = None, 0
        if first is None:
            return
        if more:
            first.args = (f"{first.args[0]} (and {more} more record(s) failed)",)
        raise first


def _error_cb(
    reporter: _Reporter, user_cb: Callable[[KafkaError], None] | None
) -> Callable[[KafkaError], None]:
    def on_error(err: KafkaError) -> None:
        reporter.on_error(err)
        if user_cb is not None:
            user_cb(err)

    return on_error


def _partition_count(producer: ProducerLike, common: CommonConfig, timeout_s: float = 10.0) -> int:
    """Partitions of the request topic, from the cluster's metadata."""
    topic = common.topics.request
    try:
        # All topics, not list_topics(topic): asking for one can auto-create it.
        metadata = producer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise DeliveryError(
            f"could not read the partition count of {topic!r} from {common.kafka.bootstrap_servers}: {exc}"
        ) from exc
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise TimersError(
            f"topic {topic!r} does not exist on {common.kafka.bootstrap_servers}: "
            "create the service's topics first (timers topics create)"
        )
    return len(info.partitions)


class _Batching:
    """What bulk scheduling needs beyond single timers: the partition count and the partitioner."""

    def __init__(self, common: CommonConfig, partitioner: str | None) -> None:
        self._common = common
        self._partitioner = partitioner
        #: The request topic's partition count, once read: it is fixed for the timers it holds.
        self.partitions: int | None = None

    def read_partitions(self, producer: ProducerLike) -> int:
        self.partitions = _partition_count(producer, self._common)
        return self.partitions

    def build(
        self, timers: Iterable[TimerSpec], partitions: int, now: float, batch_size: int, max_batch_bytes: int
    ) -> tuple[list[TimerRecord], list[TimerHandle]]:
        partition_of = partitioner_for(self._partitioner)
        return build_batches(
            self._common,
            timers,
            partitions=partitions,
            partition_of=partition_of,
            now=now,
            batch_size=batch_size,
            max_batch_bytes=max_batch_bytes,
        )


class TimerClient:
    """Synchronous timer client over one idempotent confluent-kafka producer.

    ``schedule``/``cancel`` return once the record is queued; delivery is
    confirmed by :meth:`flush` (and :meth:`close`). A record that fails is
    reported as :class:`DeliveryError` by the next ``schedule``/``cancel``/``flush``:
    the error is raised once, and the call that raises it sends nothing.

    Not thread-safe: use one client per thread, or guard it with a lock.
    """

    def __init__(
        self,
        common: CommonConfig | None = None,
        *,
        producer_config: Mapping[str, Any] | None = None,
        producer: ProducerLike | None = None,
        clock: Clock = time.time,
    ) -> None:
        self._common = CommonConfig.from_env() if common is None else common
        self._clock = clock
        self._reporter = _Reporter(self._common.kafka.bootstrap_servers)
        if producer is None:
            conf = producer_config_for(self._common, producer_config)
            conf["error_cb"] = _error_cb(self._reporter, conf.get("error_cb"))
            producer = _make_producer(conf)
        self._producer = producer
        self._batching = _Batching(self._common, (producer_config or {}).get("partitioner"))
        self._closed = False

    @property
    def common(self) -> CommonConfig:
        return self._common

    def schedule(
        self,
        topic: str,
        key: str | bytes,
        payload: str | bytes,
        *,
        at: datetime | float | None = None,
        delay: float | timedelta | None = None,
        id: str | None = None,
        token: str | None = None,
        headers: HeadersArg | None = None,
    ) -> TimerHandle:
        """Queue a timer that produces ``payload`` with ``key`` to ``topic`` when due.

        Exactly one of ``at`` (aware datetime or epoch seconds) and ``delay``
        (seconds >= 0 or timedelta). ``id`` defaults to a random uuid4 hex; scheduling
        again with the same id replaces the pending timer. ``token`` is copied to the
        callback's ``kt-token`` header (see :mod:`futures.guard`). ``headers`` are
        added to the callback record, in order.
        """
        self._check_usable()
        record, handle = build_schedule(
            self._common,
            topic,
            key,
            payload,
            at=at,
            delay=delay,
            id=id,
            token=token,
            headers=headers,
            now=self._clock(),
        )
        self._send(record, f"timer {handle.id}")
        return handle

    def send_later(
        self,
        key: str | bytes,
        value: str | bytes,
        topic: str,
        when: When,
        *,
        id: str | None = None,
        token: str | None = None,
        headers: HeadersArg | None = None,
    ) -> TimerHandle:
        """Produce ``value`` with ``key`` to ``topic`` at ``when``: :meth:`schedule` in the
        argument order of the Java library's ``sendLater(key, value, topic, when)``.

        ``when``: an aware datetime or epoch seconds (absolute), or a timedelta
        (relative to now).
        """
        return self.schedule(topic, key, value, id=id, token=token, headers=headers, **due_for(when))

    def schedule_many(
        self,
        timers: Iterable[TimerSpec],
        *,
        batch_size: int = BATCH_SIZE,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> list[TimerHandle]:
        """Queue many timers in few records; their handles, in the order given.

        Timers are grouped by the partition their id maps to and sent as
        ``FutureBatch`` records of up to ``batch_size`` timers (and
        ``max_batch_bytes``), so the worker ingests them in bulk. Each handle
        cancels like one from :meth:`schedule`. Delivery is confirmed by
        :meth:`flush`; a record that fails loses all its timers, and is reported
        like any other failure.
        """
        self._check_usable()
        partitions = self._batching.partitions or self._batching.read_partitions(self._producer)
        records, handles = self._batching.build(
            timers, partitions, self._clock(), batch_size, max_batch_bytes
        )
        for record in records:
            self._send(record, f"a batch of timers for partition {record.partition}")
        return handles

    def cancel(self, handle_or_id: TimerHandle | str, *, record_key: str | bytes | None = None) -> None:
        """Queue a cancel for a timer, by handle or id.

        ``record_key`` overrides the request key (default: the handle's, or the id),
        which must be the one the timer was scheduled with.
        """
        self._check_usable()
        record, timer_id = build_cancel(self._common, handle_or_id, record_key)
        self._send(record, f"cancel of timer {timer_id}")

    def flush(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: until all are resolved) for delivery.

        Raises :class:`DeliveryError` if a record failed or some remain undelivered.
        """
        remaining = self._producer.flush() if timeout is None else self._producer.flush(timeout)
        self._reporter.raise_pending()
        if remaining:
            hint = (
                f" (last broker error: {self._reporter.last_broker_error})"
                if self._reporter.last_broker_error
                else ""
            )
            raise DeliveryError(
                f"{remaining} record(s) still undelivered to Kafka at {self._common.kafka.bootstrap_servers} "
                f"after {timeout}s{hint}: check that the brokers are reachable"
            )

    def close(self, timeout: float | None = None) -> None:
        """Flush (see :meth:`flush`, ``timeout`` in seconds), then refuse further use."""
        if self._closed:
            return
        self._closed = True
        self.flush(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        # Already failing: still try to deliver, but never hide the original error.
        try:
            self.close()
        except TimersError:
            log.exception("timer client: undelivered records while closing after an error")

    def _check_usable(self) -> None:
        if self._closed:
            raise TimersError("this TimerClient is closed: create a new one")
        self._producer.poll(0)  # serve reports that arrived since the last call
        self._reporter.raise_pending()

    def _send(self, record: TimerRecord, what: str) -> None:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._reporter.keep(self._reporter.error_for(what, err))

        _produce(self._producer, record, on_delivery)
        self._producer.poll(0)


def _produce(
    producer: ProducerLike,
    record: TimerRecord,
    on_delivery: DeliveryCallback,
    *,
    retry_when_full: bool = True,
) -> None:
    """Produce once; when the local queue is full, serve callbacks for up to 1 s and retry once.

    With ``retry_when_full=False`` a full queue raises ``BufferError`` to the caller.
    """
    for attempt in range(2):
        try:
            if record.partition is None:
                producer.produce(
                    record.topic, record.value, record.key, on_delivery=on_delivery, headers=record.headers
                )
            else:
                producer.produce(
                    record.topic,
                    record.value,
                    record.key,
                    on_delivery=on_delivery,
                    headers=record.headers,
                    partition=record.partition,
                )
            return
        except BufferError as exc:
            if not retry_when_full:
                raise
            if attempt:
                raise DeliveryError(
                    "the producer's local queue is full: "
                    "flush() more often or raise queue.buffering.max.messages"
                ) from exc
            producer.poll(1.0)
        except KafkaException as exc:
            raise DeliveryError(f"could not produce to {record.topic!r}: {exc}") from exc


class AsyncTimerClient:
    """asyncio timer client: each ``await schedule(...)`` returns once Kafka acknowledged it.

    A background thread polls the producer and hands each delivery report back to
    the event loop of the coroutine that produced the record.
    """

    _POLL_S = 0.05
    _QUEUE_FULL_RETRIES = 20

    def __init__(
        self,
        common: CommonConfig | None = None,
        *,
        producer_config: Mapping[str, Any] | None = None,
        producer: ProducerLike | None = None,
        clock: Clock = time.time,
    ) -> None:
        self._common = CommonConfig.from_env() if common is None else common
        self._clock = clock
        self._reporter = _Reporter(self._common.kafka.bootstrap_servers)
        if producer is None:
            conf = producer_config_for(self._common, producer_config)
            conf["error_cb"] = _error_cb(self._reporter, conf.get("error_cb"))
            producer = _make_producer(conf)
        self._producer = producer
        self._batching = _Batching(self._common, (producer_config or {}).get("partitioner"))
        self._pending: set[asyncio.Future[None]] = set()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._closed = False

    @property
    def common(self) -> CommonConfig:
        return self._common

    async def schedule(
        self,
        topic: str,
        key: str | bytes,
        payload: str | bytes,
        *,
        at: datetime | float | None = None,
        delay: float | timedelta | None = None,
        id: str | None = None,
        token: str | None = None,
        headers: HeadersArg | None = None,
    ) -> TimerHandle:
        """Schedule a timer (arguments as :meth:`TimerClient.schedule`) and wait for the ack.

        Raises :class:`DeliveryError` if Kafka refused or never acknowledged the record.
        """
        self._check_usable()
        record, handle = build_schedule(
            self._common,
            topic,
            key,
            payload,
            at=at,
            delay=delay,
            id=id,
            token=token,
            headers=headers,
            now=self._clock(),
        )
        await self._send(record, f"timer {handle.id}")
        return handle

    async def send_later(
        self,
        key: str | bytes,
        value: str | bytes,
        topic: str,
        when: When,
        *,
        id: str | None = None,
        token: str | None = None,
        headers: HeadersArg | None = None,
    ) -> TimerHandle:
        """:meth:`TimerClient.send_later`, awaiting the broker's acknowledgement."""
        return await self.schedule(topic, key, value, id=id, token=token, headers=headers, **due_for(when))

    async def schedule_many(
        self,
        timers: Iterable[TimerSpec],
        *,
        batch_size: int = BATCH_SIZE,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> list[TimerHandle]:
        """:meth:`TimerClient.schedule_many`, returning once every batch record is acknowledged.

        Raises :class:`DeliveryError` if any batch record was refused (the
        others may have been scheduled: scheduling again by the same ids is safe).
        """
        self._check_usable()
        partitions = self._batching.partitions
        if partitions is None:  # a metadata request blocks: not on the event loop
            partitions = await asyncio.to_thread(self._batching.read_partitions, self._producer)
        records, handles = self._batching.build(
            timers, partitions, self._clock(), batch_size, max_batch_bytes
        )
        sends = [self._send(r, f"a batch of timers for partition {r.partition}") for r in records]
        results = await asyncio.gather(*sends, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return handles

    async def cancel(self, handle_or_id: TimerHandle | str, *, record_key: str | bytes | None = None) -> None:
        """Send a cancel (arguments as :meth:`TimerClient.cancel`) and wait for the ack."""
        self._check_usable()
        record, timer_id = build_cancel(self._common, handle_or_id, record_key)
        await self._send(record, f"cancel of timer {timer_id}")

    async def flush(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: no limit) for every record in flight.

        Useful when ``schedule`` calls run as separate tasks; raises
        :class:`DeliveryError` for failures whose caller no longer waits.
        """
        pending = set(self._pending)
        if pending:
            _done, not_done = await asyncio.wait(pending, timeout=timeout)
            if not_done:
                raise DeliveryError(
                    f"{len(not_done)} record(s) still unacknowledged by Kafka at "
                    f"{self._common.kafka.bootstrap_servers} after {timeout}s: "
                    "check that the brokers are reachable"
                )
        self._reporter.raise_pending()

    async def close(self, timeout: float | None = None) -> None:
        """Flush (``timeout`` in seconds), stop the poll thread, then refuse further use."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush(timeout)
        finally:
            self._stop.set()
            if self._poller is not None:
                await asyncio.to_thread(self._poller.join)
            # Anything the poll thread had not served yet.
            await asyncio.to_thread(self._producer.flush, 0)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.close()
            return
        try:
            await self.close()
        except TimersError:
            log.exception("async timer client: undelivered records while closing after an error")

    def _check_usable(self) -> None:
        if self._closed:
            raise TimersError("this AsyncTimerClient is closed: create a new one")
        self._reporter.raise_pending()

    def _ensure_poller(self) -> None:
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="timers-client-poll", daemon=True)
            self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(self._POLL_S)

    async def _send(self, record: TimerRecord, what: str) -> None:
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[None] = loop.create_future()
        reporter = self._reporter

        def settle(err: KafkaError | None) -> None:
            # Runs on the loop thread.
            if acked.done():  # the awaiting task was cancelled: keep the error for later
                if err is not None:
                    reporter.keep(reporter.error_for(what, err))
            elif err is None:
                acked.set_result(None)
            else:
                acked.set_exception(reporter.error_for(what, err))

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            # Runs on the poll thread.
            try:
                loop.call_soon_threadsafe(settle, err)
            except RuntimeError:  # the loop is closed; nobody awaits this record any more
                if err is not None:
                    reporter.keep(reporter.error_for(what, err))

        self._ensure_poller()
        self._pending.add(acked)
        acked.add_done_callback(self._pending.discard)
        try:
            await self._produce(record, on_delivery)
        except BaseException:
            acked.cancel()
            raise
        await acked

    async def _produce(self, record: TimerRecord, on_delivery: DeliveryCallback) -> None:
        # A full local queue drains as the poll thread serves delivery reports, so
        # wait for it without blocking the event loop.
        for _ in range(self._QUEUE_FULL_RETRIES):
            try:
                _produce(self._producer, record, on_delivery, retry_when_full=False)
                return
            except BufferError:
                await asyncio.sleep(self._POLL_S)
        _produce(self._producer, record, on_delivery)
