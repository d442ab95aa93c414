"""The worker's subscriptions: every ingress topic, in bulk to the engine, and the ticks.

Faust assigns partitions to the topics its agents consume (and the timer
table's changelog partitions with them, co-partitioned), so the agents below
declare what the worker reads. No record goes through their streams: the
transport hands each fetched batch of requests and of ticks to the engine whole
(:class:`futures.worker.transport.BulkRoute`), past Faust's per-event path, and
the engine fires in a task of its own (:meth:`TimerEngine.run`) beside ingest.
"""

from __future__ import annotations

import asyncio
import logging

import faust
from faust.types import StreamT

from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.malloc import RELEASE_EVERY_S, FreedMemory
from futures.worker.transport import BulkRoute, route_in_bulk

log = logging.getLogger(__name__)


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
            wake=engine.wake,
            batch_size=config.ingest_batch_size,
            frontier_moved=engine.frontier_moved,
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

    # Ticks, too, reach the engine through the transport (engine.note_ticks); the agent
    # declares the subscription, so that Faust assigns the oscillator's partitions.
    @app.agent(_raw_topic(app, topics.oscillator), name="oscillator-ticks")
    async def ticks(stream: StreamT) -> None:
        async for event in stream:
            raise RuntimeError(
                f"oscillator-ticks: {event.message.topic} reached Faust's stream; the worker must "
                "consume through its own transport (broker_consumer timers:// or tansu://)"
            )

    @app.task
    async def fire() -> None:
        """Fire what the ticks make due, beside ingest (the engine orders the two)."""
        try:
            await engine.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.critical("firing failed, stopping the worker: %r", exc, exc_info=True)
            await app.crash(exc)
            raise

    freed = FreedMemory(engine.metrics.timers_handled)

    @app.timer(RELEASE_EVERY_S)
    async def release_freed_memory() -> None:
        """After a burst, once quiet, hand what it freed back to the OS, between engine steps (malloc.py)."""
        if engine.idle and freed.due():
            released = await asyncio.to_thread(freed.release)
            log.debug("handed %.1f MB of freed memory back to the OS", released / 1e6)
