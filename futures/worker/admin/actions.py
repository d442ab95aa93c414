"""Cancel and reschedule by hand, through the same path as any user: records on `timer-request`.

The admin API never touches the table: it sends a ``Cancel``, or the stored ``Future``
again with a new due time, and the engine applies it like any request, writing the same
`timer-events` record (``CANCELLED``, ``SCHEDULED``). The record goes, through the
worker's own producer, to the partition that holds the timer — which a seed producer's
key (the due second) may have chosen, not the id — so the partition is explicit.

A reschedule is judged before it is sent, by the request parser the worker runs on it
(:func:`futures.ingress.native.parse`, with the worker's own limits) and by the engine's
lateness policy: what is sent is what the worker takes, so an accepted reschedule is
never dead-lettered.
"""

from __future__ import annotations

from futures.client.records import TimerRecord, build_cancel, request_headers
from futures.ingress import native
from futures.ingress.base import ParseContext, Rejection
from futures.ingress.records import SourceRecord
from futures.worker.config import LatePolicy, WorkerConfig
from futures.worker.kafka import Deliveries, KafkaWriter
from ktimers.wire import KIND_FUTURE, Future, StoredTimer


class Refused(Exception):
    """The worker would refuse this reschedule: ``reason`` is the dead-letter reason it would give."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class TimerActions:
    """Cancel and reschedule timers by id; each call returns once Kafka acknowledged the request."""

    def __init__(self, config: WorkerConfig, writer: KafkaWriter) -> None:
        self._config = config
        self._writer = writer

    async def cancel(self, timer_id: str, partition: int) -> None:
        """Send a ``Cancel`` for ``timer_id`` to `timer-request` partition ``partition``."""
        record, _ = build_cancel(self._config.common, timer_id, None)
        await self._send(record, partition, f"cancel of timer {timer_id}")

    async def reschedule(self, stored: StoredTimer, partition: int, due_ms: int, now_ms: int) -> None:
        """Send ``stored``'s Future again, all of it (a series keeps its rule and its pending
        occurrence's ordinal), due at ``due_ms`` (epoch ms): latest wins, by id.

        Raises :class:`Refused` when the worker would not take it at ``now_ms``.
        """
        record = self.replacement(stored, partition, due_ms, now_ms)
        await self._send(record, partition, f"reschedule of timer {stored.future.id}")

    def replacement(self, stored: StoredTimer, partition: int, due_ms: int, now_ms: int) -> TimerRecord:
        """The request record that moves ``stored`` to ``due_ms``, judged as the worker will."""
        future = Future()
        future.CopyFrom(stored.future)
        future.due_ms = due_ms
        record = self._record(future)
        refusal = self._parse_refusal(record, partition, now_ms) or self._late_refusal(due_ms, now_ms)
        if refusal is not None:
            raise Refused(*refusal)
        return record

    def _record(self, future: Future) -> TimerRecord:
        """A version of a known timer: keyed by its id, and not ``kt-ids: new`` (it replaces one)."""
        return TimerRecord(
            self._config.common.topics.request,
            future.id.encode(),
            future.SerializeToString(),
            request_headers(KIND_FUTURE, new_ids=False),
        )

    def _parse_refusal(self, record: TimerRecord, partition: int, now_ms: int) -> tuple[str, str] | None:
        """Why the worker's request parser would dead-letter ``record``, or None."""
        # As the worker's consumer hands it over: header values are bytes.
        headers = tuple((k, v.encode() if isinstance(v, str) else v) for k, v in record.headers)
        source = SourceRecord(record.topic, partition, -1, record.key, record.value, headers)
        for request in native.parse(source, ParseContext(self._config.parse_limits, now_ms)):
            if isinstance(request, Rejection):
                return request.reason, request.detail
        return None

    def _late_refusal(self, due_ms: int, now_ms: int) -> tuple[str, str] | None:
        """The engine refuses a timer due more than TIMERS_MAX_LATENESS_S ago unless its policy
        is ``fire`` (``futures/worker/staging.pyx``, once the partition's clock has passed it:
        judged here as if it had, since that clock only moves on)."""
        config = self._config
        if config.late_policy is LatePolicy.FIRE or (now_ms - due_ms) / 1000 <= config.max_lateness_s:
            return None
        late_s = (now_ms - due_ms) / 1000
        return (
            "too-late",
            f"due {late_s:.1f}s ago, more than TIMERS_MAX_LATENESS_S={config.max_lateness_s} "
            f"(TIMERS_LATE_POLICY={config.late_policy.value})",
        )

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
