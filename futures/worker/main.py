"""``timers-worker``: run the futures worker (a Faust worker) from the environment."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
from collections.abc import Sequence

from futures.worker.config import WORKER_ENV, WorkerConfig
from ktimers.cli import Parser, command_parser, parse_args
from ktimers.config import SHARED_ENV
from ktimers.errors import TimersError
from ktimers.topics import verify_topics

log = logging.getLogger("futures.worker.main")

#: Allocations between two young-generation collections (CPython's default is 700).
GC_GEN0_THRESHOLD = 50_000

#: glibc malloc arenas the worker's threads share, unless ``MALLOC_ARENA_MAX`` says otherwise.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Have glibc's malloc keep to ``arenas`` arenas; whether it was set here.

    glibc gives threads arenas of their own, up to eight per core, and what is freed in one
    arena is reused only by the threads that allocate from it: RocksDB's flush and compaction
    threads and librdkafka's each hold some, 15-60 MB of a worker's resident memory in all
    at 1-10 M pending timers. Set before those threads start. ``MALLOC_ARENA_MAX`` in the
    environment (which glibc reads itself) is left to decide; where the C library is not
    glibc there is nothing to set.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def build_parser() -> Parser:
    return command_parser(
        "timers-worker",
        "The futures worker (a Faust worker): stores timer requests and fires them on the oscillator's "
        "ticks.\nConfigured by the environment only.",
        [("environment, shared", SHARED_ENV), ("environment, worker", WORKER_ENV)],
    )


def main(argv: Sequence[str] | None = None) -> None:
    # Before anything that touches Kafka or the data dir: --help and --version stop here.
    parse_args(build_parser(), argv)
    limit_malloc_arenas()
    level = os.environ.get("TIMERS_LOG_LEVEL", "info").lower()
    try:
        config = WorkerConfig.from_env()
        partitions = verify_topics(config.common)
    except TimersError as exc:
        print(f"timers-worker: {exc}", file=sys.stderr)
        sys.exit(2)
    # Imported only now: Faust and the engine take about a second to import, which
    # --help and --version do not wait for.
    import faust

    from futures.worker.wiring import build

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
    # What is built so far lives as long as the process: out of the cycle collector's
    # sight, and collections far apart, so that a hot second (a few short-lived objects
    # per timer) is not paused by scans of the whole heap. Reference counting frees
    # nearly everything the engine makes; cycles are rare.
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
