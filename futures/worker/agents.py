"""The worker's subscriptions: every ingress topic and the ticks, in bulk to the engine.

Faust assigns partitions to the topics its agents consume (and the timer
table's changelog partitions with them, co-partitioned), so the agents below
declare what the worker reads. The records themselves do not go through their
streams: the transport hands each fetched batch to the engine whole
(:class:`futures.worker.transport.BulkRoute`), past Faust's per-event path.
"""

from __future__ import annotations

import faust
from faust.types import StreamT

from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.transport import BulkRoute, route_in_bulk


def _raw_topic(app: faust.App, *names: str) -> faust.TopicT:
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def register_agents(app: faust.App, engine: TimerEngine, config: WorkerConfig) -> None:
    topics = config.common.topics
    route_in_bulk(
        app,
        BulkRoute(
            ticks_topic=topics.oscillator,
            request_topics=frozenset(topics.ingress_formats),
            advance=engine.advance,
            ingest=engine.ingest,
            batch_size=config.ingest_batch_size,
        ),
    )

    async def never(stream: StreamT, name: str) -> None:
        async for event in stream:
            # Only a transport other than timers:// or tansu:// would deliver here;
            # acking what the engine never applied would lose timers, so stop instead.
            raise RuntimeError(
                f"{name}: {event.message.topic} reached Faust's stream; the worker must consume "
                "through its own transport (broker_consumer timers:// or tansu://)"
            )

    # Every ingress topic (timer-request and TIMERS_INGRESS_TOPICS, co-partitioned):
    # the engine parses each record by its topic's format.
    @app.agent(_raw_topic(app, *topics.ingress_formats), name="timer-requests")
    async def requests(stream: StreamT) -> None:
        await never(stream, "timer-requests")

    # Several oscillators tick every partition every second; a batch of them is
    # one clock move per partition (the engine keeps the highest second).
    @app.agent(_raw_topic(app, topics.oscillator), name="oscillator-ticks")
    async def ticks(stream: StreamT) -> None:
        await never(stream, "oscillator-ticks")
