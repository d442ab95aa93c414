"""Cancel and reschedule by hand, through the same path as any user: records on `timer-request`.

The admin API never touches the table: it sends a ``Cancel`` (or a new ``Future``
with the same id), built by the client library's record builders, and the engine
applies it like any request, writing the same `timer-events` record
(``CANCELLED``, ``SCHEDULED``). The record goes, through the worker's own
producer, to the partition that holds the timer — which a seed producer's key
(the due second) may have chosen, not the id — so the partition is explicit.
"""

from __future__ import annotations

import time

from futures.client.records import TimerHandle, TimerRecord, build_cancel, build_schedule
from futures.worker.kafka import Deliveries, KafkaWriter
from ktimers.config import CommonConfig
from ktimers.wire import StoredTimer


class TimerActions:
    """Cancel and reschedule timers by id; each call returns once Kafka acknowledged the request."""

    def __init__(self, common: CommonConfig, writer: KafkaWriter) -> None:
        self._common = common
        self._writer = writer

    async def cancel(self, timer_id: str, partition: int) -> None:
        """Send a ``Cancel`` for ``timer_id`` to `timer-request` partition ``partition``."""
        record, _ = build_cancel(self._common, timer_id, None)
        await self._send(record, partition, f"cancel of timer {timer_id}")

    async def reschedule(self, stored: StoredTimer, partition: int, due_ms: int) -> TimerHandle:
        """Send ``stored``'s Future again with a new due time (epoch ms): latest wins, by id.

        Raises ValueError when the stored Future cannot be sent as it is (e.g. a
        header name the client reserves).
        """
        future = stored.future
        record, handle = build_schedule(
            self._common,
            future.callBackTopic,
            future.callBackKey,
            future.callBack,
            now=time.time(),
            at=due_ms / 1000,
            id=future.id,
            token=future.token or None,
            headers=[(h.key, h.value) for h in future.headers],
        )
        await self._send(record, partition, f"reschedule of timer {future.id}")
        return handle

    async def _send(self, record: TimerRecord, partition: int, what: str) -> None:
        deliveries = Deliveries()
        self._writer.produce(
            record.topic,
            record.key,
            record.value,
            headers=record.headers,
            partition=partition,
            deliveries=deliveries,
        )
        await self._writer.delivered(deliveries)
        deliveries.raise_first(what)
