"""The synchronous client: queue timer requests on one idempotent producer, confirm with flush."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import TracebackType
from typing import Self, Unpack

from confluent_kafka import KafkaError, Message

from futures.client import records
from futures.client.core import _ClientCore, _produce
from futures.client.records import CallbackOptions, Data, ScheduleOptions, TimerHandle, TimerSpec, When
from ktimers.errors import DeliveryError, TimersError

log = logging.getLogger(__name__)


class TimerClient(_ClientCore):
    """Synchronous timer client over one idempotent confluent-kafka producer.

    ``schedule``/``cancel`` return once the record is queued; delivery is
    confirmed by :meth:`flush` (and :meth:`close`). A record that fails is
    reported as :class:`DeliveryError` by the next ``schedule``/``cancel``/``flush``:
    the error is raised once, and the call that raises it sends nothing.

    Not thread-safe: use one client per thread, or guard it with a lock.

    With ``schema_registry`` (a confluent-kafka ``SchemaRegistryClient``, or its
    URL), requests are framed as Schema Registry serializers frame them, for
    request topics that enforce schemas; ``schema_serializer_config`` is
    ``ProtobufSerializer``'s configuration. Needs the ``registry`` extra.
    """

    def schedule(
        self, topic: str, key: str | bytes, payload: str | bytes, **options: Unpack[ScheduleOptions]
    ) -> TimerHandle:
        """Queue a timer that produces ``payload`` with ``key`` to ``topic`` when due.

        Exactly one of ``at`` (aware datetime or epoch seconds) and ``delay``
        (seconds >= 0 or timedelta); ``id``, ``token``, ``headers``: see
        :class:`~futures.client.records.ScheduleOptions`.
        """
        record, handle = self._schedule_record(topic, key, payload, options)
        self._send(record, f"timer {handle.id}")
        return handle

    def send_later(
        self, key: Data, value: Data, topic: str, when: When, **options: Unpack[CallbackOptions]
    ) -> TimerHandle:
        """Produce ``value`` with ``key`` to ``topic`` at ``when``: :meth:`schedule` in the
        argument order of the Java library's ``sendLater(key, value, topic, when)``.

        ``when``: an aware datetime or epoch seconds (absolute), or a timedelta
        (relative to now).
        """
        return self.schedule(topic, key, value, **options, **records.due_for(when))

    def schedule_many(
        self,
        timers: Iterable[TimerSpec],
        *,
        batch_size: int = records.BATCH_SIZE,
        max_batch_bytes: int = records.MAX_BATCH_BYTES,
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
        records, handles = self._batch_records(timers, self._read_partitions(), batch_size, max_batch_bytes)
        for record in records:
            self._send(record, f"a batch of timers for partition {record.partition}")
        return handles

    def cancel(self, handle_or_id: TimerHandle | str, *, record_key: str | bytes | None = None) -> None:
        """Queue a cancel for a timer, by handle or id.

        ``record_key`` overrides the request key (default: the handle's, or the id),
        which must be the one the timer was scheduled with.
        """
        record, timer_id = self._cancel_record(handle_or_id, record_key)
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
        if not self._closed:
            self._producer.poll(0)  # serve reports that arrived since the last call
        super()._check_usable()

    def _send(self, record: records.TimerRecord, what: str) -> None:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._reporter.keep(self._reporter.error_for(what, err))

        # Its report is served by the next call's _check_usable, or by flush.
        _produce(self._producer, record, on_delivery)
