"""``timers schedule``: a timer (or a series) from the command line; prints its handle as JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from futures.console import connect, decode
from futures.console.options import add_delivery_timeout, duration, header, instant, positive_int
from futures.console.output import kafka_log, print_json
from futures.durations import DURATION_HELP, INSTANT_HELP
from ktimers.cli import UsageError
from ktimers.config import CommonConfig


def add_parser(commands: Any) -> None:
    """Add ``schedule`` to the subparsers ``commands``."""
    sched = commands.add_parser("schedule", help="schedule a timer; prints its handle as JSON")
    sched.add_argument("--topic", required=True, help="topic the callback record goes to")
    sched.add_argument("--key", required=True, help="key of the callback record")
    value = sched.add_mutually_exclusive_group(required=True)
    value.add_argument("--value", help="value of the callback record (UTF-8 text)")
    value.add_argument(
        "--value-file", type=Path, help="file holding the callback value (raw bytes; - for stdin)"
    )
    when = sched.add_mutually_exclusive_group()
    when.add_argument(
        "--delay", type=duration, help=f"fire after this long (a series: start then): {DURATION_HELP}"
    )
    when.add_argument("--at", type=instant, help=f"fire at this time (a series: start then): {INSTANT_HELP}")
    series = sched.add_mutually_exclusive_group()
    series.add_argument(
        "--cron",
        metavar="EXPR",
        help="fire again and again at the times of this five-field cron expression "
        "(minute hour day-of-month month day-of-week, e.g. '0 9 * * mon-fri'; @daily, @hourly, …)",
    )
    series.add_argument(
        "--every",
        type=duration,
        metavar="DURATION",
        help=f"fire again and again this far apart: {DURATION_HELP}",
    )
    sched.add_argument("--tz", metavar="ZONE", help="IANA time zone --cron is read in (default UTC)")
    sched.add_argument("--until", type=instant, help=f"no occurrence of the series after: {INSTANT_HELP}")
    sched.add_argument("--max-count", type=positive_int, metavar="N", help="occurrences of the series in all")
    sched.add_argument("--id", help="timer id (default: random); reusing an id replaces that timer")
    sched.add_argument("--token", help="token copied to the callback's kt-token header")
    sched.add_argument(
        "--header", type=header, action="append", default=[], metavar="NAME=VALUE", help="callback header"
    )
    add_delivery_timeout(sched)
    sched.set_defaults(run=_schedule)


def _read_value(args: argparse.Namespace) -> bytes:
    if args.value is not None:
        return str(args.value).encode()
    path: Path = args.value_file
    try:
        return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read --value-file {str(path)!r}: {exc.strerror}", "timers schedule"
        ) from exc


def _check_when(args: argparse.Namespace) -> None:
    recurring = args.cron is not None or args.every is not None
    if not recurring and args.delay is None and args.at is None:
        raise UsageError(
            "give --delay or --at (or --cron or --every for a recurring timer) (see: timers schedule --help)",
            "timers schedule",
        )
    if args.tz is not None and args.cron is None:
        raise UsageError("--tz is the time zone of --cron: give --cron too", "timers schedule")
    extras = [name for name, value in (("--until", args.until), ("--max-count", args.max_count)) if value]
    if extras and not recurring:
        verb = "end" if len(extras) > 1 else "ends"
        raise UsageError(
            f"{' and '.join(extras)} {verb} a series: give --cron or --every too", "timers schedule"
        )


def _schedule(args: argparse.Namespace) -> int:
    _check_when(args)
    payload = _read_value(args)
    common = connect.common()
    client = connect.client(common, args.delivery_timeout)
    try:
        handle = client.schedule(
            args.topic,
            args.key,
            payload,
            at=args.at,
            delay=args.delay,
            id=args.id,
            token=args.token,
            headers=args.header,
            cron=args.cron,
            tz=args.tz,
            every=args.every,
            until=args.until,
            max_count=args.max_count,
        )
    except ValueError as exc:
        raise UsageError(_option_names(str(exc)), "timers schedule") from exc
    connect.send_and_wait(client, args.delivery_timeout)
    out: dict[str, Any] = {
        "id": handle.id,
        "topic": handle.callback_topic,
        "key": args.key,
        "due_ms": handle.due_ms,
        "due": decode.iso_ms(handle.due_ms),
    }
    if handle.token is not None:
        out["token"] = handle.token
    if args.cron is not None or args.every is not None:
        out["series"] = {
            "cron": args.cron,
            "time_zone": (args.tz or "UTC") if args.cron is not None else None,
            "interval_ms": None if args.every is None else round(args.every * 1000),
            "until_ms": None if args.until is None else round(args.until * 1000),
            "max_count": args.max_count,
        }
    print_json(out)
    warn_if_missing(common, args.topic)
    return 0


#: The client's keyword arguments, as the command's options name them in its errors.
_OPTION_NAMES = {
    "cron=": "--cron",
    "every=": "--every",
    "tz=": "--tz",
    "until=": "--until",
    "max_count=": "--max-count",
}


def _option_names(message: str) -> str:
    for keyword, option in _OPTION_NAMES.items():
        message = message.replace(keyword, option + " ")
    return message


def warn_if_missing(common: CommonConfig, topic: str) -> None:
    """Say on stderr when the callback topic does not exist: the worker never creates one, and
    dead-letters a timer whose topic is still missing when it fires. Silent when the brokers
    do not answer the question (the timer was delivered: that is what counts)."""
    conf: dict[str, Any] = {**common.kafka.librdkafka(), "logger": kafka_log}
    admin = AdminClient(conf)
    try:
        # All topics: asking for one by name can create it on a broker that creates on first use.
        topics = admin.list_topics(timeout=5).topics
    except KafkaException:
        return
    if topic not in topics:
        print(
            f"timers schedule: warning: topic {topic!r} does not exist on {common.kafka.bootstrap_servers}: "
            f"create it before the timer fires (timers topics create --callback {topic}), or the worker "
            "dead-letters it as callback-undeliverable",
            file=sys.stderr,
        )
