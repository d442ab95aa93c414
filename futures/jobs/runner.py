"""What every job's ``main()`` shares: Spark options, logging, progress, and errors as one line."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from confluent_kafka import KafkaException
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from futures.durations import INSTANT_HELP, parse_instant
from futures.jobs.config import JOB_ENV
from futures.jobs.session import SparkSettings, build_session, resolve_master
from ktimers.cli import EnvGroup, Parser, UsageError, command_parser, fail
from ktimers.config import COMMON_ENV
from ktimers.errors import TimersError
from ktimers.topics import kafka_reason

#: spark.sql.shuffle.partitions for local masters, unless --shuffle-partitions says otherwise: an upper
#: bound, Spark merges them into tasks of about LOCAL_TASK_SHUFFLE_BYTES (session.build_session).
LOCAL_SHUFFLE_PARTITIONS = 64

log = logging.getLogger("futures.jobs")

# Our own errors raised inside Spark tasks reach the driver wrapped in Java
# exceptions; this finds the line that says what went wrong.
_OUR_ERROR = re.compile(r"^(?:futures\.jobs\.errors|ktimers\.errors)\.(\w+): (.+)$", re.MULTILINE)


#: argparse that reports errors as one line (a UsageError) instead of usage plus exit.
JobParser = Parser

#: What the jobs read from the environment (``--help`` lists it).
JOB_ENV_GROUPS: list[EnvGroup] = [("environment", COMMON_ENV), ("environment, jobs", JOB_ENV)]


def job_parser(prog: str, description: str) -> Parser:
    """The parser of a job: ``--version``, and ``--help`` listing the environment."""
    return command_parser(prog, description, JOB_ENV_GROUPS)


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        help="Spark master (default local[*]; under spark-submit, the one spark-submit was given)",
    )
    parser.add_argument(
        "--max-records-per-split",
        type=int,
        default=0,
        metavar="N",
        help="cut each Kafka partition into Spark tasks of at most N records "
        "(default: one task per partition)",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        metavar="N",
        help=f"spark.sql.shuffle.partitions (default {LOCAL_SHUFFLE_PARTITIONS} in local mode, else Spark's)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress output, only the result")


def instant_ms(text: str) -> int:
    """``--due-from``/``--due-to`` values: ISO 8601 with a zone, epoch seconds or ``now`` → epoch ms."""
    if text.strip().lower() == "now":
        return time.time_ns() // 1_000_000
    try:
        return round(parse_instant(text) * 1000)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


INSTANT_ARG_HELP = f"{INSTANT_HELP}, or now"


def setup_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # py4j logs every gateway call at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@contextmanager
def step(what: str) -> Iterator[None]:
    """Log the start and the duration of one step of a job."""
    log.info("%s...", what)
    started = time.monotonic()
    yield
    log.info("%s: done in %.1fs", what, time.monotonic() - started)


def spark_for(args: argparse.Namespace, app_name: str) -> SparkSession:
    master = resolve_master(args.master)
    shuffle = args.shuffle_partitions
    if shuffle is None and master is not None and master.startswith("local"):
        # Spark's default of 200 makes a laptop-sized job write 200 shuffle files a task.
        shuffle = LOCAL_SHUFFLE_PARTITIONS
    return build_session(
        SparkSettings(master=master, app_name=app_name, progress=not args.quiet, shuffle_partitions=shuffle)
    )


def run_main(
    prog: str,
    parser: argparse.ArgumentParser,
    job: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """Parse, run, and turn every error a user can fix into one line on stderr and status 2."""
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return fail(prog, str(exc))
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    setup_logging(args.quiet)
    try:
        return job(args)
    except (UsageError, TimersError) as exc:
        return fail(prog, str(exc))
    except KafkaException as exc:
        return fail(
            prog,
            f"Kafka error: {kafka_reason(exc)}. Check KAFKA_BOOTSTRAP_SERVERS, the KAFKA_* security settings "
            "and that the brokers are up",
        )
    except PySparkException as exc:
        ours = _OUR_ERROR.findall(str(exc))
        if ours:
            return fail(prog, ours[-1][1])
        raise
    except KeyboardInterrupt:
        return 130
