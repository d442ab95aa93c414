"""Faust stream handlers: they only batch records and hand them to the engine."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import cast

import faust
from faust.types import EventT, StreamT

from futures.config import WorkerConfig
from futures.engine import TimerEngine
from futures.records import SourceRecord

log = logging.getLogger(__name__)


def to_record(event: EventT) -> SourceRecord:
    message = event.message
    headers = message.headers
    return SourceRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=message.value,
        headers=tuple(headers.items() if isinstance(headers, Mapping) else headers or ()),
    )


def _raw_topic(app: faust.App, name: str) -> faust.TopicT:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def register_agents(app: faust.App, engine: TimerEngine, config: WorkerConfig) -> None:
    topics = config.common.topics

    async def handle(batches: AsyncIterator[Sequence[EventT]], name: str, apply: object) -> None:
        try:
            async for events in batches:
                await apply([to_record(e) for e in events])  # type: ignore[operator]
        except Exception as exc:
            # Nothing of the failed batch was committed; stop the worker so it
            # restarts and reads the batch again, instead of skipping it.
            log.critical("%s failed, stopping the worker: %r", name, exc, exc_info=True)
            await app.crash(exc)
            raise

    @app.agent(_raw_topic(app, topics.request), name="timer-requests")
    async def requests(stream: StreamT) -> None:
        batches = cast(faust.Stream, stream).take_events(
            config.ingest_batch_size, within=config.ingest_batch_within_s
        )
        await handle(batches, "ingest", engine.ingest)

    # Several oscillators tick every partition every second; a batch of them is
    # one clock move per partition (the engine keeps the highest second).
    @app.agent(_raw_topic(app, topics.oscillator), name="oscillator-ticks")
    async def ticks(stream: StreamT) -> None:
        batches = cast(faust.Stream, stream).take_events(1000, within=0.01)
        await handle(batches, "tick", engine.advance)
