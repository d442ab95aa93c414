"""The asyncio client: each ``await`` returns once Kafka acknowledged the record."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Self, Unpack

from confluent_kafka import KafkaError, Message

from futures.client import records
from futures.client.core import _ClientCore, _produce
from futures.client.records import CallbackOptions, Data, ScheduleOptions, TimerHandle, TimerSpec, When
from ktimers.errors import DeliveryError, TimersError
from ktimers.producer import DeliveryCallback

log = logging.getLogger(__name__)


class AsyncTimerClient(_ClientCore):
    """asyncio timer client: each ``await schedule(...)`` returns once Kafka acknowledged it.

    A background thread polls the producer and hands each delivery report back to
    the event loop of the coroutine that produced the record.
    """

    _POLL_S = 0.05
    _QUEUE_FULL_RETRIES = 20

    def _setup(self) -> None:
        self._pending: set[asyncio.Future[None]] = set()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    async def schedule(
        self, topic: str, key: str | bytes, payload: str | bytes, **options: Unpack[ScheduleOptions]
    ) -> TimerHandle:
        """Schedule a timer (arguments as :meth:`TimerClient.schedule`) and wait for the ack.

        Raises :class:`DeliveryError` if Kafka refused or never acknowledged the record.
        """
        self._check_usable()  # a closed client says so, before it asks the Schema Registry
        await self._framing_ready()
        record, handle = self._schedule_record(topic, key, payload, options)
        await self._send(record, f"timer {handle.id}")
        return handle

    async def send_later(
        self, key: Data, value: Data, topic: str, when: When, **options: Unpack[CallbackOptions]
    ) -> TimerHandle:
        """:meth:`TimerClient.send_later`, awaiting the broker's acknowledgement."""
        return await self.schedule(topic, key, value, **options, **records.due_for(when))

    async def schedule_many(
        self,
        timers: Iterable[TimerSpec],
        *,
        batch_size: int = records.BATCH_SIZE,
        max_batch_bytes: int = records.MAX_BATCH_BYTES,
    ) -> list[TimerHandle]:
        """:meth:`TimerClient.schedule_many`, returning once every batch record is acknowledged.

        Raises :class:`DeliveryError` if any batch record was refused (the
        others may have been scheduled: scheduling again by the same ids is safe).
        """
        self._check_usable()
        await self._framing_ready()
        partitions = self._partitions
        if partitions is None:  # a metadata request blocks: not on the event loop
            partitions = await asyncio.to_thread(self._read_partitions)
        records, handles = self._batch_records(timers, partitions, batch_size, max_batch_bytes)
        sends = [self._send(r, f"a batch of timers for partition {r.partition}") for r in records]
        results = await asyncio.gather(*sends, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return handles

    async def cancel(self, handle_or_id: TimerHandle | str, *, record_key: str | bytes | None = None) -> None:
        """Send a cancel (arguments as :meth:`TimerClient.cancel`) and wait for the ack."""
        self._check_usable()
        await self._framing_ready()
        record, timer_id = self._cancel_record(handle_or_id, record_key)
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

    async def _framing_ready(self) -> None:
        """Ask the Schema Registry for the framing, if any, in a thread: never on the event loop."""
        if self._framing is not None and not self._framing.ready:
            await asyncio.to_thread(self._framing.prepare)

    def _ensure_poller(self) -> None:
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="timers-client-poll", daemon=True)
            self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(self._POLL_S)

    async def _send(self, record: records.TimerRecord, what: str) -> None:
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

    async def _produce(self, record: records.TimerRecord, on_delivery: DeliveryCallback) -> None:
        # A full local queue drains as the poll thread serves delivery reports, so
        # wait for it without blocking the event loop.
        for _ in range(self._QUEUE_FULL_RETRIES):
            try:
                _produce(self._producer, record, on_delivery, retry_when_full=False)
                return
            except BufferError:
                await asyncio.sleep(self._POLL_S)
        _produce(self._producer, record, on_delivery)
