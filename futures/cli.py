"""The ``timers`` command: schedule, cancel and watch timers, ask the running service, and set up
topics. Each command is a module of :mod:`futures.console`; this one builds the parser and turns
what goes wrong into one line and an exit status.

Kafka connection and topic names come from the environment (``KAFKA_*``,
``TIMERS_*``; see :mod:`ktimers.config`). Every failure a user can fix prints one
line on stderr that says what to do, and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaException

from futures.console import broker, cancel, connect, schedule, topics, watch
from futures.console.admin import ADMIN_ENV
from futures.console.commands import add_commands
from futures.console.output import kafka_log
from ktimers.cli import UsageError, command_parser, fail
from ktimers.config import COMMON_ENV
from ktimers.errors import DeliveryError, TimersError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "timers",
        "Durable timers on Kafka.",
        [("environment", COMMON_ENV), ("environment, admin API (list, show, status)", ADMIN_ENV)],
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show Kafka client logs")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    schedule.add_parser(commands)
    cancel.add_parser(commands)
    watch.add_parser(commands)
    add_commands(commands)
    topics.add_parser(commands)
    broker.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``timers`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(str(exc), exc.prog or "timers")
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    _setup_logging(args.verbose)
    run: Handler = args.run
    try:
        return run(args)
    except UsageError as exc:
        return _fail(str(exc), exc.prog or "timers")
    except DeliveryError as exc:
        return _fail(f"{exc}. Check KAFKA_BOOTSTRAP_SERVERS and that the brokers are running.")
    except TimersError as exc:
        return _fail(str(exc))
    except KafkaException as exc:
        return _fail(
            f"Kafka error: {connect.reason(exc)}. "
            "Check KAFKA_BOOTSTRAP_SERVERS and the KAFKA_* security settings."
        )
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _output_closed()


def _output_closed() -> int:
    """The reader of our output went away (``timers watch … | head`` once ``head`` has its lines):
    stop quietly, as Unix tools do. Python would otherwise report the failed flush of stdout
    at exit, so it is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _fail(message: str, prog: str = "timers") -> int:
    return fail(prog, message)


def _setup_logging(verbose: bool) -> None:
    kafka_log.propagate = verbose
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    elif not kafka_log.handlers:
        kafka_log.addHandler(logging.NullHandler())


if __name__ == "__main__":
    sys.exit(main())
