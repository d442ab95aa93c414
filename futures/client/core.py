"""What the sync and asyncio clients share: the producer, its error reports, bulk batching."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from futures.client.framing import RequestFraming
from futures.client.partitioner import partitioner_for
from futures.client.records import (
    Clock,
    ScheduleOptions,
    TimerHandle,
    TimerRecord,
    TimerSpec,
    build_batches,
    build_cancel,
    build_schedule,
)
from ktimers.config import CommonConfig
from ktimers.errors import ConfigError, DeliveryError, TimersError
from ktimers.producer import ANY_PARTITION, DeliveryCallback, ProducerLike


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
        if self._first is None:
            return  # read without the lock: an error kept meanwhile is raised by the next call
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


class _ClientCore:
    """State and record building common to :class:`TimerClient` and :class:`AsyncTimerClient`."""

    def __init__(
        self,
        common: CommonConfig | None = None,
        *,
        producer_config: Mapping[str, Any] | None = None,
        producer: ProducerLike | None = None,
        clock: Clock = time.time,
        schema_registry: Any = None,
        schema_serializer_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._common = CommonConfig.from_env() if common is None else common
        #: Frames requests as Schema Registry serializers do, when ``schema_registry`` (a
        #: ``SchemaRegistryClient`` or its URL) is given: for request topics that enforce schemas.
        self._framing = (
            None
            if schema_registry is None
            else RequestFraming(schema_registry, self._common.topics.request, schema_serializer_config)
        )
        self._clock = clock
        self._reporter = _Reporter(self._common.kafka.bootstrap_servers)
        if producer is None:
            conf = producer_config_for(self._common, producer_config)
            conf["error_cb"] = _error_cb(self._reporter, conf.get("error_cb"))
            producer = _make_producer(conf)
        self._producer = producer
        self._partition_of = partitioner_for((producer_config or {}).get("partitioner"))
        #: The request topic's partition count, once read: it is fixed for the timers it holds.
        self._partitions: int | None = None
        self._closed = False
        self._setup()

    def _setup(self) -> None:
        """State of a subclass of its own, set up after the core's."""

    @property
    def common(self) -> CommonConfig:
        return self._common

    def _schedule_record(
        self, topic: str, key: str | bytes, payload: str | bytes, options: ScheduleOptions
    ) -> tuple[TimerRecord, TimerHandle]:
        self._check_usable()
        record, handle = build_schedule(self._common, topic, key, payload, now=self._clock(), **options)
        return self._framed(record), handle

    def _cancel_record(
        self, handle_or_id: TimerHandle | str, record_key: str | bytes | None
    ) -> tuple[TimerRecord, str]:
        self._check_usable()
        record, timer_id = build_cancel(self._common, handle_or_id, record_key)
        return self._framed(record), timer_id

    def _read_partitions(self) -> int:
        """The request topic's partition count (blocks on a metadata request the first time)."""
        if self._partitions is None:
            self._partitions = _partition_count(self._producer, self._common)
        return self._partitions

    def _batch_records(
        self, timers: Iterable[TimerSpec], partitions: int, batch_size: int, max_batch_bytes: int
    ) -> tuple[list[TimerRecord], list[TimerHandle]]:
        records, handles = build_batches(
            self._common,
            timers,
            partitions=partitions,
            partition_of=self._partition_of,
            now=self._clock(),
            batch_size=batch_size,
            max_batch_bytes=max_batch_bytes,
        )
        return [self._framed(record) for record in records], handles

    def _framed(self, record: TimerRecord) -> TimerRecord:
        """``record`` as it is sent: framed when the client was given a Schema Registry."""
        return record if self._framing is None else self._framing.frame(record)

    def _check_usable(self) -> None:
        if self._closed:
            raise TimersError(f"this {type(self).__name__} is closed: create a new one")
        self._reporter.raise_pending()


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
    # Positional, in confluent-kafka's order (ProducerLike): it parses keywords at a cost
    # close to queueing the record.
    partition = ANY_PARTITION if record.partition is None else record.partition
    for attempt in range(2):
        try:
            producer.produce(
                record.topic, record.value, record.key, partition, on_delivery, None, 0, record.headers
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
