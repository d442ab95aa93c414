"""The oscillator's run: serve the probes, wait for the brokers and the topic, tick until stopped.

Startup order: start the health server (live, not ready), wait for the brokers and the
topic (one line says what for; retried with back-off), create the producer, log
``oscillator started``, tick until SIGTERM/SIGINT, then flush and return 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ktimers.cli import EXIT_USAGE
from ktimers.errors import TimersError
from ktimers.shutdown import StopFlag
from ktimers.waiting import wait_for
from oscillator.clock import TickSchedule
from oscillator.config import OscillatorConfig
from oscillator.health import HealthServer, Liveness, Readiness
from oscillator.metrics import OscillatorMetrics
from oscillator.partitions import PartitionWatcher, admin_client, partition_reader
from oscillator.producer import TickProducer, build_producer

log = logging.getLogger("oscillator")

# The loop sleeps in slices no longer than this (seconds), so a stop request is
# seen within it; the tick itself is not delayed, the last slice ends on the boundary.
MAX_SLEEP_S = 0.05
# Kubernetes waits 30 s before SIGKILL, but a restart should be quick and ticks
# older than a second are superseded anyway (seconds).
FLUSH_TIMEOUT_S = 1.5


def tick_loop(
    schedule: TickSchedule,
    ticks: TickProducer,
    partitions: Callable[[], int],
    stop: StopFlag,
    sleep: Callable[[float], None] = time.sleep,
    beat: Callable[[], None] = lambda: None,
) -> None:
    """Tick every second until ``stop`` is requested; ``beat`` on every turn (liveness)."""
    while not stop.requested:
        beat()
        ticks.poll()
        second = schedule.take()
        if second is None:
            sleep(min(schedule.wait_s(), MAX_SLEEP_S))
            continue
        ticks.send(second, partitions())


def run(config: OscillatorConfig, stop: StopFlag) -> int:
    """Run the oscillator until ``stop`` is requested; return the process exit code."""
    metrics = OscillatorMetrics()
    liveness = Liveness()
    readiness = Readiness(config.stale_after_s)
    try:
        health = HealthServer(config.health_host, config.health_port, liveness, readiness, metrics)
    except OSError as exc:
        log.error(
            "oscillator cannot start: cannot serve /healthz on %s:%d: %s. "
            "Set TIMERS_OSC_HEALTH_HOST/TIMERS_OSC_HEALTH_PORT to a free address.",
            config.health_host,
            config.health_port,
            exc.strerror or exc,
        )
        return EXIT_USAGE
    health.start()
    try:
        return _serve(config, stop, liveness, readiness, metrics, health.port)
    finally:
        health.stop()


def _serve(
    config: OscillatorConfig,
    stop: StopFlag,
    liveness: Liveness,
    readiness: Readiness,
    metrics: OscillatorMetrics,
    port: int,
) -> int:
    kafka, topic = config.common.kafka, config.common.topics.oscillator
    read = partition_reader(admin_client(kafka), topic, kafka)
    readiness.waiting(f"waiting for Kafka at {kafka.bootstrap_servers}")

    def sleep(seconds: float) -> None:
        liveness.beat()  # waiting is the loop turning too
        time.sleep(seconds)

    try:
        partitions = wait_for(
            read, who="oscillator", log=log, stopped=lambda: stop.requested, sleep=sleep,
            on_wait=readiness.waiting,
        )  # fmt: skip
    except TimersError as exc:
        log.error("oscillator cannot start: %s", exc)
        return EXIT_USAGE
    if partitions is None:
        log.info("oscillator stopped (%s) before its brokers answered", stop.reason)
        return 0
    watcher = PartitionWatcher(read, config.metadata_refresh_s, partitions)
    watcher.start()
    readiness.waiting("no tick delivered yet")
    ticks = TickProducer(
        lambda: build_producer(kafka, config.instance), topic, config.instance, metrics, readiness
    )
    log.info(
        "oscillator started: instance=%s topic=%s partitions=%d health=http://%s:%d/healthz",
        config.instance,
        topic,
        partitions,
        config.health_host,
        port,
    )
    try:
        tick_loop(TickSchedule(), ticks, lambda: watcher.count, stop, beat=liveness.beat)
    finally:
        watcher.stop()
        undelivered = ticks.flush(FLUSH_TIMEOUT_S)
        if undelivered:
            log.warning("%d tick record(s) still undelivered at shutdown", undelivered)
    log.info("oscillator stopped (%s)", stop.reason)
    return 0
