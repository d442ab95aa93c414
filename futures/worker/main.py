"""``timers-worker``: run the futures worker (a Faust worker) from the environment."""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from futures.worker.changelog_topic import KafkaTopicConfigs, check_changelog
from futures.worker.config import WORKER_ENV, WorkerConfig
from futures.worker.malloc import limit_malloc_arenas
from futures.worker.startup import make_data_dir, wait_for_topics
from ktimers.cli import EXIT_USAGE, Parser, command_parser, fail, parse_args
from ktimers.config import SHARED_ENV, env_log_level
from ktimers.errors import TimersError
from ktimers.shutdown import StopFlag
from ktimers.topics import admin_client

log = logging.getLogger("futures.worker.main")

#: Allocations between two young-generation collections (CPython's default is 700).
GC_GEN0_THRESHOLD = 50_000


def build_parser() -> Parser:
    return command_parser(
        "timers-worker",
        "The futures worker (a Faust worker): stores timer requests and fires them on the oscillator's "
        "ticks.\nConfigured by the environment only.",
        [("environment, shared", SHARED_ENV), ("environment, worker", WORKER_ENV)],
    )


def _cannot_start(exc: TimersError) -> NoReturn:
    fail("timers-worker", str(exc))
    sys.exit(EXIT_USAGE)


def main(argv: Sequence[str] | None = None) -> None:
    # Before anything that touches Kafka or the data dir: --help and --version stop here.
    parse_args(build_parser(), argv)
    limit_malloc_arenas()
    # Imported only now: Faust and the engine take about a second to import, which --help and
    # --version do not wait for; and before anything else, so that an install without the
    # worker extra says so at once (ktimers.scripts), not once the brokers answer.
    import faust

    from futures.worker.wiring import build

    try:
        level = env_log_level(os.environ)
        config = WorkerConfig.from_env()
        config.common.kafka.ssl_context()  # a CA bundle that is not there: said now, in one line
        make_data_dir(config.data_dir)
    except TimersError as exc:
        _cannot_start(exc)
    logging.basicConfig(level=level, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    stop = StopFlag()
    stop.install()
    try:
        waited = wait_for_topics(config, lambda: stop.requested)
    except TimersError as exc:
        _cannot_start(exc)
    if waited is None:
        log.info("futures worker stopped (%s) before its brokers answered", stop.reason)
        sys.exit(0)
    partitions = waited
    try:
        # Before any table is opened: how old one may be and still be caught up exactly.
        topics = KafkaTopicConfigs(admin_client(config.common), config.common.kafka)
        reuse = check_changelog(config.changelog_topic, topics)
    except TimersError as exc:
        _cannot_start(exc)
    app, _ = build(config, partitions, reuse)
    session_s, heartbeat_s, rebalance_s = config.group_timeouts
    static = config.instance_id if config.common.kafka.settings.static_membership else None
    log.info(
        "futures worker %s: %d partitions, profile %s, data in %s; group instance %s, "
        "session %gs, heartbeat %gs, rebalance %gs",
        config.app_id, partitions, config.common.kafka.profile.value, config.data_dir,
        static or "(dynamic)", session_s, heartbeat_s, rebalance_s,
    )  # fmt: skip
    log.info("admin page at %s/admin/, its API at %s/api/", config.canonical_url, config.canonical_url)
    if config.instance_id and not static:
        log.warning("TIMERS_INSTANCE_ID is ignored on the embedded broker (no static membership there)")
    worker = faust.Worker(app, loglevel=level.lower(), quiet=True)
    # What is built so far lives as long as the process: out of the cycle collector's
    # sight, and collections far apart, so that a hot second (a few short-lived objects
    # per timer) is not paused by scans of the whole heap. Reference counting frees
    # nearly everything the engine makes; cycles are rare.
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
