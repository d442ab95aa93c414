"""The ``timers`` command: schedule, cancel and watch timers, and set up topics.

Kafka connection and topic names come from the environment (``KAFKA_*``,
``TIMERS_*``; see :mod:`ktimers.config`). Every failure a user can fix prints one
line on stderr that says what to do, and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from futures.client import TimerClient
from futures.console import decode
from futures.console.admin import ADMIN_ENV
from futures.console.answers import EventTail
from futures.console.commands import add_commands
from futures.console.options import add_delivery_timeout, duration, header, instant, port, positive_int
from futures.console.output import EXIT_INCOMPLETE, EXIT_NOT_PENDING, kafka_log, print_json
from futures.durations import DURATION_HELP, INSTANT_HELP
from ktimers.cli import UsageError, command_parser, fail
from ktimers.config import COMMON_ENV, CommonConfig, TopicsConfig
from ktimers.errors import DeliveryError, TimersError
from ktimers.shutdown import StopFlag
from ktimers.topics import create_topics, verify_topics
from ktimers.wire import (
    H_DUE_MS,
    H_FIRED_MS,
    KafkaHeaders,
    TimerEvent,
    header_value,
    message_headers,
    text_or_repr,
)

#: How long ``timers cancel --wait`` waits for the worker's answer by default (seconds).
CANCEL_WAIT_S = 30.0
#: How often ``timers watch`` looks for a topic that does not exist yet (seconds).
WATCH_TOPIC_POLL_S = 0.5

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "timers",
        "Durable timers on Kafka.",
        [("environment", COMMON_ENV), ("environment, admin API (list, show, status)", ADMIN_ENV)],
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show Kafka client logs")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

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

    cancel = commands.add_parser("cancel", help="cancel a pending timer by id")
    cancel.add_argument("id", metavar="ID", help="timer id, as printed by `timers schedule`")
    cancel.add_argument("--key", help="request record key the timer was scheduled with (default: the id)")
    cancel.add_argument(
        "--wait",
        action="store_true",
        help="wait for the worker's answer on timer-events: exit 0 when CANCELLED, "
        f"{EXIT_NOT_PENDING} when CANCEL_MISSED (not pending: unknown id or already fired), "
        f"{EXIT_INCOMPLETE} when no answer came before --timeout",
    )
    cancel.add_argument(
        "--timeout",
        type=duration,
        help=f"with --wait: give up after this long (default 30s): {DURATION_HELP}",
    )
    add_delivery_timeout(cancel)
    cancel.set_defaults(run=_cancel)

    watch = commands.add_parser("watch", help="print records arriving on a topic, with their lateness")
    watch.add_argument("topic", metavar="TOPIC")
    watch.add_argument("--from-beginning", action="store_true", help="start at the oldest record")
    watch.add_argument("--count", type=positive_int, help="stop after this many records")
    watch.add_argument("--timeout", type=duration, help=f"stop after this long: {DURATION_HELP}")
    watch.add_argument(
        "--raw",
        action="store_true",
        help="print every record as it is (key, value, headers), without decoding the service's "
        "events, dead letters and requests",
    )
    watch.set_defaults(run=_watch)

    add_commands(commands)

    topics = commands.add_parser("topics", help="create or check the service's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    create = topic_commands.add_parser("create", help="create missing topics, then check the layout")
    create.add_argument(
        "--partitions", type=positive_int, help="partition count (default: TIMERS_PARTITIONS)"
    )
    create.add_argument(
        "--callback",
        action="append",
        default=[],
        metavar="TOPIC",
        help="also create this callback topic (repeatable): the worker never creates one itself",
    )
    create.set_defaults(run=_topics_create)
    check = topic_commands.add_parser("check", help="check the topics exist and are co-partitioned")
    check.set_defaults(run=_topics_check)

    broker = commands.add_parser(
        "broker",
        help="run only the embedded broker (Tansu, memory only: for trying things out); Ctrl-C stops it",
    )
    broker.add_argument(
        "--port", type=port, default=9092, help="port on 127.0.0.1 (default 9092; 0: any free port)"
    )
    broker.add_argument("--no-topics", action="store_true", help="do not create the service's topics")
    broker.set_defaults(run=_broker)
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
            f"Kafka error: {_reason(exc)}. Check KAFKA_BOOTSTRAP_SERVERS and the KAFKA_* security settings."
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


def _reason(exc: KafkaException) -> str:
    """The librdkafka error text, without the KafkaError{...} wrapping."""
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def _unreachable(common: CommonConfig, exc: KafkaException) -> TimersError:
    return TimersError(
        f"cannot reach Kafka at {common.kafka.bootstrap_servers} ({_reason(exc)}). "
        "Check KAFKA_BOOTSTRAP_SERVERS and that the brokers are running."
    )


def _setup_logging(verbose: bool) -> None:
    kafka_log.propagate = verbose
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    elif not kafka_log.handlers:
        kafka_log.addHandler(logging.NullHandler())


def _common() -> CommonConfig:
    return CommonConfig.from_env()


def _client(common: CommonConfig, delivery_timeout_s: float) -> TimerClient:
    return TimerClient(
        common,
        producer_config={"message.timeout.ms": max(1, round(delivery_timeout_s * 1000)), "logger": kafka_log},
    )


def _send_and_wait(client: TimerClient, delivery_timeout_s: float) -> None:
    # message.timeout.ms makes librdkafka fail the record itself; the margin lets
    # that precise error arrive before flush gives up.
    client.close(timeout=delivery_timeout_s + 5.0)


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
    common = _common()
    client = _client(common, args.delivery_timeout)
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
    _send_and_wait(client, args.delivery_timeout)
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
    _warn_if_missing(common, args.topic)
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


def _warn_if_missing(common: CommonConfig, topic: str) -> None:
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


def _cancel(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.wait:
        raise UsageError("--timeout is how long --wait waits: give --wait too", "timers cancel")
    common = _common()
    client = _client(common, args.delivery_timeout)
    sent = {"id": args.id, "record_key": args.key or args.id}
    if not args.wait:
        _send_cancel(client, args)
        print_json({**sent, "cancel": "sent"})
        return 0
    timeout = CANCEL_WAIT_S if args.timeout is None else args.timeout
    deadline = time.monotonic() + timeout
    with EventTail(common, kafka_log) as tail:
        tail.catch_up(deadline)
        _send_cancel(client, args)
        event = tail.wait_for(args.id, (TimerEvent.CANCELLED, TimerEvent.CANCEL_MISSED), deadline)
    if event is None:
        print_json({**sent, "cancel": "no-answer"})
        print(
            f"timers cancel: the cancel of {args.id!r} was sent, but {common.topics.events!r} had no answer "
            f"within {timeout:g}s: is a worker running? (a longer --timeout waits more)",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    answer = {
        **sent,
        "cancel": "cancelled" if event.kind == TimerEvent.CANCELLED else "missed",
        **{k: v for k, v in decode.event_json(event).items() if k not in ("id", "source_offset")},
    }
    print_json(answer)
    if event.kind == TimerEvent.CANCELLED:
        return 0
    print(f"timers cancel: {args.id!r} was not pending: unknown id, or it already fired", file=sys.stderr)
    return EXIT_NOT_PENDING


def _send_cancel(client: TimerClient, args: argparse.Namespace) -> None:
    try:
        client.cancel(args.id, record_key=args.key)
    except ValueError as exc:
        raise UsageError(str(exc), "timers cancel") from exc
    _send_and_wait(client, args.delivery_timeout)


def _int_header(headers: KafkaHeaders, name: str) -> int | None:
    raw = header_value(headers, name)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def record_json(msg: Any) -> dict[str, Any]:
    """What ``timers watch`` prints for one record; lateness in milliseconds.

    ``lateness_ms`` is the record's Kafka timestamp (for a callback: when the worker wrote it)
    minus its ``kt-due-ms``, so it says the same whenever the record is read; ``fire_delay_ms``
    is ``kt-fired-ms`` (when the worker sent it, by its own clock) minus ``kt-due-ms``.
    """
    headers = message_headers(msg)
    if headers is None:
        headers = (("?", b"<unreadable: a header key is not UTF-8>"),)
    out: dict[str, Any] = {
        "partition": msg.partition(),
        "offset": msg.offset(),
        "key": text_or_repr(msg.key()),
        "value": text_or_repr(msg.value()),
        "headers": {k: text_or_repr(v) for k, v in headers},
    }
    due_ms = _int_header(headers, H_DUE_MS)
    if due_ms is not None:
        out["due"] = decode.iso_ms(due_ms)
        kind, written_ms = msg.timestamp()
        if kind != TIMESTAMP_NOT_AVAILABLE:
            out["lateness_ms"] = written_ms - due_ms
        fired_ms = _int_header(headers, H_FIRED_MS)
        if fired_ms is not None:
            out["fire_delay_ms"] = fired_ms - due_ms
    return out


def watch_lines(msg: Any, topics: TopicsConfig) -> list[dict[str, Any]]:
    """What ``timers watch`` prints for one record: the service's own records decoded (one line
    per event of a ``timer-events`` record), any other record as :func:`record_json` has it."""
    headers = message_headers(msg)
    if headers is None:
        return [record_json(msg)]
    where = {"partition": msg.partition(), "offset": msg.offset()}
    shown = {k: text_or_repr(v) for k, v in headers}  # as record_json has them
    kind = decode.kind_of(msg.topic(), topics, headers)
    try:
        if kind is decode.RecordKind.EVENTS:
            events = decode.events_of(msg.value(), headers)
            if not events:  # a line all the same: a watch counts records
                return [{**record_json(msg), "decode_error": "a timer-events record with no events"}]
            return [{**where, **decode.event_json(e)} for e in events]
        if kind is decode.RecordKind.DEAD_LETTER:
            return [
                {
                    **where,
                    "key": text_or_repr(msg.key()),
                    "headers": shown,
                    **decode.dead_letter_json(msg.value(), headers),
                }
            ]
        if kind is decode.RecordKind.REQUEST:
            request = decode.request_json(msg.value(), headers)
            return [{**where, "key": text_or_repr(msg.key()), "headers": shown, "request": request}]
    except ValueError as exc:
        return [{**record_json(msg), "decode_error": str(exc)}]
    return [record_json(msg)]


def _watch(args: argparse.Namespace) -> int:
    common = _common()
    consumer = Consumer(
        {
            **common.kafka.librdkafka(),
            # assign() below needs no group; librdkafka still wants an id. Nothing is committed.
            "group.id": f"timers-watch-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "logger": kafka_log,
        }
    )
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        partitions = _partitions(consumer, args.topic, common, deadline)
        start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
        # Assigning skips the group join (seconds on the embedded broker) and leaves no group behind.
        consumer.assign([TopicPartition(args.topic, p, start) for p in partitions])
        return _print_records(consumer, args, common.topics, deadline)
    except KeyboardInterrupt:
        return 0
    finally:
        consumer.close()


def _partitions(consumer: Consumer, topic: str, common: CommonConfig, deadline: float | None) -> list[int]:
    """The partitions of ``topic``; until ``deadline`` (monotonic seconds), waits for it to exist.

    A callback topic is often created by its first callback (brokers that create topics on
    first use), so a watch started with the timer would otherwise fail before it fires.
    """
    while True:
        try:
            # All topics, not list_topics(topic): asking for one can auto-create it.
            metadata = consumer.list_topics(timeout=10)
        except KafkaException as exc:
            raise _unreachable(common, exc) from exc
        info = metadata.topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            return sorted(info.partitions)
        if deadline is None or time.monotonic() >= deadline:
            fix = (
                "check the name (or give --timeout to wait for it)" if deadline is None else "check the name"
            )
            raise UsageError(
                f"topic {topic!r} does not exist on {common.kafka.bootstrap_servers}: {fix}", "timers watch"
            )
        time.sleep(min(WATCH_TOPIC_POLL_S, max(0.0, deadline - time.monotonic())))


def _print_records(
    consumer: Consumer, args: argparse.Namespace, topics: TopicsConfig, deadline: float | None
) -> int:
    seen = 0
    while args.count is None or seen < args.count:
        wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
        if wait <= 0:
            if args.count is not None:
                print(
                    f"timers: watch timed out after {args.timeout:g}s with {seen} of {args.count} records",
                    file=sys.stderr,
                )
                return EXIT_INCOMPLETE
            return 0
        msg = consumer.poll(wait)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise KafkaException(err)
            print(f"timers: warning: {err.str()}", file=sys.stderr)
            continue
        for line in [record_json(msg)] if args.raw else watch_lines(msg, topics):
            print_json(line)
        seen += 1
    return 0


def _probe(common: CommonConfig) -> AdminClient:
    """An admin client known to reach Kafka, so later steps fail on their own merits."""
    conf: dict[str, Any] = {**common.kafka.librdkafka(), "logger": kafka_log}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise _unreachable(common, exc) from exc
    return admin


def _topics_create(args: argparse.Namespace) -> int:
    common = _common()
    if args.partitions is not None:
        common = replace(common, topics=replace(common.topics, partitions=args.partitions))
    _probe(common)
    created = create_topics(common, callback_topics=args.callback)
    print(f"created: {', '.join(created)}" if created else "all topics already exist")
    print(f"ok: {', '.join(_service_topics(common))} are ready")
    return 0


def _topics_check(args: argparse.Namespace) -> int:
    common = _common()
    partitions = verify_topics(common, admin=_probe(common))
    print(f"ok: {', '.join(_service_topics(common))} exist with {partitions} partitions each")
    return 0


def _broker(args: argparse.Namespace) -> int:
    # Imported here: the embedded broker is the `embedded` extra, not the client's install.
    from ktimers.broker import start_broker

    stop = StopFlag()
    stop.install()
    broker = start_broker(port=args.port or None)
    try:
        env = broker.env()
        print(f"embedded broker (Tansu, memory only) listening on {broker.bootstrap_servers}")
        if not args.no_topics:
            common = CommonConfig.from_env({**os.environ, **env})
            create_topics(common)
            print(f"topics: {', '.join(_service_topics(common))}")
        print("point clients and services at it (paste in another shell):")
        print("  export " + " ".join(f"{name}={value}" for name, value in env.items()))
        print("Ctrl-C stops it; everything it holds is lost.", flush=True)
        while not stop.requested:
            if broker.process.poll() is not None:
                raise TimersError(f"the embedded broker exited with status {broker.process.returncode}")
            time.sleep(0.2)
        print(f"stopping ({stop.reason})", flush=True)
        return 0
    finally:
        broker.stop()


def _service_topics(common: CommonConfig) -> list[str]:
    t = common.topics
    return [t.oscillator, t.request, t.events, t.dlq, *(f"{name} ({fmt.value})" for name, fmt in t.ingress)]


if __name__ == "__main__":
    sys.exit(main())
