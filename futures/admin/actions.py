"""Cancel and reschedule by hand, through the same path as any user: records on `timer-request`.

The admin API never touches the table: it sends a ``Cancel`` (or a new ``Future``
with the same id) with the client library, and the engine applies it like any
request, writing the same `timer-events` record (``CANCELLED``, ``SCHEDULED``).
The record goes to the partition that holds the timer — which a seed producer's
key (the due second) may have chosen, not the id — so the client's producer is
wrapped to pin each record's partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from confluent_kafka import Producer
from confluent_kafka.admin import ClusterMetadata

from futures.client import (
    AsyncTimerClient,
    DeliveryCallback,
    ProducerLike,
    RecordHeaders,
    TimerHandle,
    producer_config_for,
)
from ktimers.config import CommonConfig
from ktimers.errors import TimersError
from ktimers.wire import StoredTimer


class PartitionPinnedProducer:
    """A :class:`ProducerLike` that sends each record to the partition pinned for its key."""

    def __init__(self, producer: ProducerLike) -> None:
        self._producer = producer
        self._pins: dict[bytes, int] = {}

    @contextmanager
    def pinned(self, key: bytes, partition: int) -> Iterator[None]:
        """Records keyed ``key`` produced inside this block go to ``partition``."""
        self._pins[key] = partition
        try:
            yield
        finally:
            self._pins.pop(key, None)

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        *,
        on_delivery: DeliveryCallback | None = None,
        headers: RecordHeaders | None = None,
        partition: int = -1,
    ) -> None:
        raw = key.encode() if isinstance(key, str) else key
        pinned = self._pins.get(raw) if raw is not None else None
        if pinned is None:
            # Letting the partitioner choose could send a cancel where the timer is not.
            raise TimersError(f"no partition pinned for record key {key!r}")
        producer: Any = self._producer  # confluent's Producer: partition is a keyword there
        producer.produce(topic, value, key, partition=pinned, on_delivery=on_delivery, headers=headers)

    def poll(self, timeout: float = -1) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = -1) -> int:
        return self._producer.flush(timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        producer: Any = self._producer
        return cast(ClusterMetadata, producer.list_topics(topic, timeout))


class TimerActions:
    """Cancel and reschedule timers by id; each call returns once Kafka acknowledged the request.

    The producer is created on first use, so a read-only admin API opens none.
    """

    def __init__(self, common: CommonConfig, producer: ProducerLike | None = None) -> None:
        self._common = common
        self._producer = producer
        self._pinned: PartitionPinnedProducer | None = None
        self._client: AsyncTimerClient | None = None

    def _ready(self) -> tuple[AsyncTimerClient, PartitionPinnedProducer]:
        if self._client is None or self._pinned is None:
            producer = self._producer or Producer(
                producer_config_for(self._common, {"client.id": "kafka-timers-admin"})
            )
            self._pinned = PartitionPinnedProducer(producer)
            self._client = AsyncTimerClient(self._common, producer=self._pinned)
        return self._client, self._pinned

    async def cancel(self, timer_id: str, partition: int) -> None:
        """Send a ``Cancel`` for ``timer_id`` to `timer-request` partition ``partition``."""
        client, pinned = self._ready()
        with pinned.pinned(timer_id.encode(), partition):
            await client.cancel(timer_id)

    async def reschedule(self, stored: StoredTimer, partition: int, due_ms: int) -> TimerHandle:
        """Send ``stored``'s Future again with a new due time (epoch ms): latest wins, by id.

        Raises ValueError when the stored Future cannot be sent as it is (e.g. a
        header name the client reserves).
        """
        client, pinned = self._ready()
        future = stored.future
        with pinned.pinned(future.id.encode(), partition):
            return await client.schedule(
                future.callBackTopic,
                future.callBackKey,
                future.callBack,
                at=due_ms / 1000,
                id=future.id,
                token=future.token or None,
                headers=[(h.key, h.value) for h in future.headers],
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close(timeout=10)
