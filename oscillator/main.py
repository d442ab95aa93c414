"""Entry point: ``timers-oscillator`` or ``python -m oscillator.main``.

Startup order: parse the command line (``--help``/``--version`` stop there), read
the partition count (fail fast on a missing topic), create the producer, start the
health server, log ``oscillator started``, tick until SIGTERM/SIGINT, then flush
and exit 0.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence

from ktimers.cli import Parser, command_parser, parse_args
from ktimers.config import SHARED_ENV
from ktimers.errors import ConfigError, DeliveryError, TimersError
from ktimers.shutdown import StopFlag
from oscillator.clock import TickSchedule
from oscillator.config import OSCILLATOR_ENV, OscillatorConfig
from oscillator.health import HealthServer, Liveness
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
) -> None:
    """Tick every second until ``stop`` is requested.

    Raises :class:`DeliveryError` when the producer hits a fatal error.
    """
    while not stop.requested:
        ticks.poll()
        second = schedule.take()
        if second is None:
            sleep(min(schedule.wait_s(), MAX_SLEEP_S))
            continue
        ticks.send(second, partitions())


def run(config: OscillatorConfig, stop: StopFlag) -> int:
    """Run the oscillator until ``stop`` is requested; return the process exit code."""
    kafka, topic = config.common.kafka, config.common.topics.oscillator
    admin = admin_client(kafka)
    watcher = PartitionWatcher(
        partition_reader(admin, topic, kafka.bootstrap_servers), config.metadata_refresh_s
    )
    try:
        partitions = watcher.start()
    except TimersError as exc:
        log.error("oscillator cannot start: %s", exc)
        return 1

    metrics = OscillatorMetrics()
    liveness = Liveness(config.stale_after_s)
    ticks = TickProducer(build_producer(kafka, config.instance), topic, config.instance, metrics, liveness)
    try:
        health = HealthServer(config.health_host, config.health_port, liveness, metrics)
    except OSError as exc:
        watcher.stop()
        log.error(
            "oscillator cannot start: cannot serve /healthz on %s:%d: %s. "
            "Set TIMERS_OSC_HEALTH_HOST/TIMERS_OSC_HEALTH_PORT to a free address.",
            config.health_host,
            config.health_port,
            exc,
        )
        return 1
    health.start()
    log.info(
        "oscillator started: instance=%s topic=%s partitions=%d health=http://%s:%d/healthz",
        config.instance,
        topic,
        partitions,
        config.health_host,
        health.port,
    )

    exit_code = 0
    try:
        tick_loop(TickSchedule(), ticks, lambda: watcher.count, stop)
    except DeliveryError as exc:
        log.error("oscillator stopping: %s", exc)
        exit_code = 1
    finally:
        watcher.stop()
        undelivered = ticks.flush(FLUSH_TIMEOUT_S)
        if undelivered:
            log.warning("%d tick record(s) still undelivered at shutdown", undelivered)
        health.stop()
    log.info("oscillator stopped (%s)", stop.reason or "error")
    return exit_code


def build_parser() -> Parser:
    return command_parser(
        "timers-oscillator",
        "The oscillator: one tick a second to every partition of the oscillator topic, "
        "until SIGTERM/SIGINT.\nConfigured by the environment only.",
        [("environment, shared", SHARED_ENV), ("environment, oscillator", OSCILLATOR_ENV)],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parse_args(build_parser(), argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = StopFlag()
    stop.install()
    try:
        config = OscillatorConfig.from_env()
    except ConfigError as exc:
        log.error("oscillator cannot start: %s", exc)
        return 1
    logging.getLogger().setLevel(config.log_level)
    return run(config, stop)


if __name__ == "__main__":
    sys.exit(main())
