"""The worker's subscriptions: every ingress topic, in bulk to the engine, and the ticks.

Faust assigns partitions to the topics its agents consume (and the timer
table's changelog partitions with them, co-partitioned), so the agents below
declare what the worker reads. Request records do not go through their stream:
the transport hands each fetched batch to the engine whole
(:class:`futures.worker.transport.BulkRoute`), past Faust's per-event path.
Ticks — a few a second — do, so that firing runs beside ingest.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import cast

import faust
from faust.types import EventT, StreamT

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.transport import BulkRoute, route_in_bulk

log = logging.getLogger(__name__)


def to_record(event: EventT) -> SourceRecord:
    message = event.message
    headers = message.headers
    # Faust holds the Kafka timestamp (ms) as float seconds: back to exact ms.
    timestamp = message.timestamp
    return SourceRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=message.value,
        headers=tuple(headers.items() if isinstance(headers, Mapping) else headers or ()),
        timestamp_ms=round(timestamp * 1000) if timestamp is not None else -1,
    )


def _raw_topic(app: faust.App, *names: str) -> faust.TopicT:
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def register_agents(app: faust.App, engine: TimerEngine, config: WorkerConfig) -> None:
    topics = config.common.topics
    route_in_bulk(
        app,
        BulkRoute(
            request_topics=frozenset(topics.ingress_formats),
            ingest=engine.ingest,
            tick_topic=topics.oscillator,
            note_ticks=engine.note_ticks,
            batch_size=config.ingest_batch_size,
        ),
    )

    # Every ingress topic (timer-request and TIMERS_INGRESS_TOPICS, co-partitioned):
    # the engine parses each record by its topic's format.
    @app.agent(_raw_topic(app, *topics.ingress_formats), name="timer-requests")
    async def requests(stream: StreamT) -> None:
        async for event in stream:
            # Only a transport other than timers:// or tansu:// would deliver here;
            # acking what the engine never applied would lose timers, so stop instead.
            raise RuntimeError(
                f"timer-requests: {event.message.topic} reached Faust's stream; the worker must "
                "consume through its own transport (broker_consumer timers:// or tansu://)"
            )

    # Several oscillators tick every partition every second; a batch of them is
    # one clock move per partition (the engine keeps the highest second).
    @app.agent(_raw_topic(app, topics.oscillator), name="oscillator-ticks")
    async def ticks(stream: StreamT) -> None:
        # noack_take, not take_events: take_events acks a batch in a `finally`,
        # so a batch cut off by shutdown or a crash would be acked without having
        # been applied. Here a batch is acked only once the engine has applied it.
        batches = cast(AsyncIterator[Sequence[EventT]], cast(faust.Stream, stream).noack_take(1000, 0.01))
        try:
            async for events in batches:
                await engine.advance([to_record(e) for e in events])
                for event in events:
                    await stream.ack(event)
        except Exception as exc:
            # Nothing of the failed batch was acked; stop the worker so it restarts.
            log.critical("tick failed, stopping the worker: %r", exc, exc_info=True)
            await app.crash(exc)
            raise
