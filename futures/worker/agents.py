"""Faust stream handlers: they only batch records and hand them to the engine."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import cast

import faust
from faust.types import EventT, StreamT

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine

log = logging.getLogger(__name__)

Apply = Callable[[Sequence[SourceRecord]], Awaitable[None]]


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

    async def handle(stream: StreamT, max_: int, within: float, name: str, apply: Apply) -> None:
        # noack_take, not take_events: take_events acks a batch in a `finally`,
        # so a batch cut off by shutdown or a crash would be acked (and its
        # offsets committed) without having been applied: lost timers. Here a
        # batch is acked only once the engine has made it durable.
        batches = cast(AsyncIterator[Sequence[EventT]], cast(faust.Stream, stream).noack_take(max_, within))
        try:
            async for events in batches:
                await apply([to_record(e) for e in events])
                for event in events:
                    await stream.ack(event)
        except Exception as exc:
            # Nothing of the failed batch was committed; stop the worker so it
            # restarts and reads the batch again, instead of skipping it.
            log.critical("%s failed, stopping the worker: %r", name, exc, exc_info=True)
            await app.crash(exc)
            raise

    # Every ingress topic (timer-request and TIMERS_INGRESS_TOPICS, co-partitioned)
    # feeds one stream: the engine parses each record by its topic's format.
    @app.agent(_raw_topic(app, *topics.ingress_formats), name="timer-requests")
    async def requests(stream: StreamT) -> None:
        await handle(stream, config.ingest_batch_size, config.ingest_batch_within_s, "ingest", engine.ingest)

    # Several oscillators tick every partition every second; a batch of them is
    # one clock move per partition (the engine keeps the highest second).
    @app.agent(_raw_topic(app, topics.oscillator), name="oscillator-ticks")
    async def ticks(stream: StreamT) -> None:
        await handle(stream, 1000, 0.01, "tick", engine.advance)
