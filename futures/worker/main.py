"""``timers-worker``: run the futures worker (a Faust worker) from the environment."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import faust
from confluent_kafka import Producer

from futures.worker import fetch
from futures.worker.agents import register_agents
from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.destinations import CallbackTopics
from futures.worker.engine import TimerEngine
from futures.worker.gaps import KafkaGapReader
from futures.worker.kafka import KafkaWriter, producer_config
from futures.worker.metrics import WorkerMetrics
from futures.worker.web import register_views
from ktimers.errors import TimersError
from ktimers.topics import verify_topics

log = logging.getLogger("futures.worker.main")


def build(config: WorkerConfig, partitions: int) -> tuple[faust.App, TimerEngine]:
    fetch.install()  # a header key that is not UTF-8 must not stop the consumer
    timers = create_app(config, partitions)
    store = timers.store
    metrics = WorkerMetrics()
    metrics.watch_tables(store.open_partitions)
    producer = Producer(producer_config(config.common.kafka, config.max_record_bytes))
    writer = KafkaWriter(producer, config.max_record_bytes)
    callback_topics = CallbackTopics.of_producer(producer)
    engine = TimerEngine(
        config,
        store.partition,
        writer,
        metrics,
        owns=store.owns,
        lock=store.lock,
        gaps=KafkaGapReader(config.common.kafka),
        callback_topics=callback_topics,
    )
    register_agents(timers.app, engine, config)
    register_views(timers.app, metrics, store, config, engine.status, writer)

    # mode types receivers with a positional-only sender that no def can spell.
    @timers.app.on_before_shutdown.connect  # type: ignore[arg-type]
    def flush_on_shutdown(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Each engine step flushes before it returns; this catches a step cut short.
        writer.close()
        callback_topics.close()

    return timers.app, engine


def main() -> None:
    level = os.environ.get("TIMERS_LOG_LEVEL", "info").lower()
    try:
        config = WorkerConfig.from_env()
        partitions = verify_topics(config.common)
    except TimersError as exc:
        print(f"timers-worker: {exc}", file=sys.stderr)
        sys.exit(2)
    app, _ = build(config, partitions)
    session_s, heartbeat_s, rebalance_s = config.group_timeouts
    static = config.instance_id if config.common.kafka.settings.static_membership else None
    log.info(
        "futures worker %s: %d partitions, profile %s, data in %s; group instance %s, "
        "session %gs, heartbeat %gs, rebalance %gs",
        config.app_id, partitions, config.common.kafka.profile.value, config.data_dir,
        static or "(dynamic)", session_s, heartbeat_s, rebalance_s,
    )  # fmt: skip
    if config.instance_id and not static:
        log.warning("TIMERS_INSTANCE_ID is ignored on the embedded broker (no static membership there)")
    worker = faust.Worker(app, loglevel=level, quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
