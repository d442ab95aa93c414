"""Wires one worker together: the Faust app, the timer store, the engine, the writer and the views.

Kept apart from :mod:`futures.worker.main` so that ``timers-worker --help`` answers
without importing Faust (about a second).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
from confluent_kafka import Producer

from futures.worker import fetch
from futures.worker.agents import register_agents
from futures.worker.app import create_app
from futures.worker.brokers import BrokerWatch
from futures.worker.changelog_topic import KafkaTopicConfigs, TableReuse, check_changelog
from futures.worker.config import WorkerConfig
from futures.worker.destinations import CallbackTopics
from futures.worker.engine import TimerEngine
from futures.worker.gaps import KafkaGapReader
from futures.worker.kafka import LINGER_MS, PRECISE_LINGER_MS, KafkaWriter, producer_config
from futures.worker.metrics import WorkerMetrics
from futures.worker.transport import TimerConsumer
from futures.worker.web import register_views
from ktimers.topics import admin_client

#: How long reading the changelog's settings again may take (seconds), in a thread after a rebalance.
RECHECK_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)


class ConsumerView:
    """What the app's consumer (created by Faust after the engine) knows of the requests: their
    frontier, and the offsets it read past without one."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    def _consumer(self) -> TimerConsumer:
        consumer = self._app.consumer
        assert isinstance(consumer, TimerConsumer)  # noqa: S101 - create_app's broker_consumer
        return consumer

    def frontier_ms(self, partition: int) -> int | None:
        return self._consumer().frontier_ms(partition)

    def holds_no_request(self, topic: str, partition: int, start: int, end: int) -> bool:
        return self._consumer().holds_no_request(topic, partition, start, end)


def build(config: WorkerConfig, partitions: int, reuse: TableReuse) -> tuple[faust.App, TimerEngine]:
    """The worker's app and engine; ``reuse``: how old a table may be to be caught up rather than
    rebuilt, from the changelog's settings (:func:`~futures.worker.changelog_topic.check_changelog`)."""
    fetch.install()  # a header key that is not UTF-8 must not stop the consumer
    timers = create_app(config, partitions)
    store = timers.store
    store.reuse = reuse
    store.recheck = lambda: check_changelog(
        config.changelog_topic,
        KafkaTopicConfigs(admin_client(config.common), config.common.kafka, RECHECK_TIMEOUT_S),
    )
    metrics = WorkerMetrics()
    metrics.watch_tables(store.open_partitions)
    kafka, max_bytes = config.common.kafka, config.max_record_bytes
    linger_ms = PRECISE_LINGER_MS if config.precise else LINGER_MS
    producer = Producer(producer_config(kafka, max_bytes, linger_ms=linger_ms))
    quiet = Producer(producer_config(kafka, max_bytes, quiet=True, linger_ms=linger_ms))
    callbacks_config = producer_config(kafka, max_bytes, callbacks=True, linger_ms=linger_ms)

    def new_callbacks() -> Producer:
        return Producer(callbacks_config)

    writer = KafkaWriter(
        producer, max_bytes, quiet=quiet, callbacks=new_callbacks(), new_callbacks=new_callbacks
    )
    callback_topics = CallbackTopics.of_producer(producer)
    metrics.watch_callback_topics(lambda: callback_topics.forgotten)
    crashing: set[asyncio.Task[None]] = set()

    def crash(exc: BaseException) -> None:
        # A precise window's durable writes failed (logged by the engine): stop, as a failed tick does.
        task = asyncio.ensure_future(timers.app.crash(exc))
        crashing.add(task)
        task.add_done_callback(crashing.discard)

    view = ConsumerView(timers.app)
    engine = TimerEngine(
        config,
        store.partition,
        writer,
        metrics,
        owns=store.owns,
        lock=store.lock,
        gaps=KafkaGapReader(config.common.kafka),
        read_past=view,
        callback_topics=callback_topics,
        frontier=view,
        on_fatal=crash,
    )
    store.on_revoked = engine.revoke
    store.on_settle = engine.settle_revoked
    store.on_assigned = engine.own

    @timers.app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def settle_revoked(sender: Any, revoked: set[Any], *, signal: Any, **kwargs: Any) -> None:
        # Sent last in Faust's revocation, which the consumer awaits before it rejoins the group.
        await store.settle_revoked()

    register_agents(timers.app, engine, config)
    brokers = BrokerWatch(config.common.kafka, config.common.topics.request)
    brokers.start()
    register_views(timers.app, metrics, store, config, engine.status, writer, brokers)

    # mode types receivers with a positional-only sender that no def can spell.
    @timers.app.on_before_shutdown.connect  # type: ignore[arg-type]
    def flush_on_shutdown(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Each engine step flushes before it returns; this catches a step cut short.
        brokers.stop()
        left = writer.close()
        if left:
            log.warning("%d record(s) not delivered at shutdown: written again after a restart", left)
        callback_topics.close()

    return timers.app, engine
