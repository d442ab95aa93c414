"""``timers watch``: print the records arriving on a topic, the service's own decoded, with lateness."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
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

from futures.console import connect, decode
from futures.console.options import duration, positive_int
from futures.console.output import EXIT_INCOMPLETE, kafka_log, print_json
from futures.durations import DURATION_HELP
from ktimers.cli import UsageError
from ktimers.config import CommonConfig, TopicsConfig
from ktimers.wire import H_DUE_MS, H_FIRED_MS, KafkaHeaders, header_value, message_headers, text_or_repr

#: How often ``timers watch`` looks for a topic that does not exist yet (seconds).
WATCH_TOPIC_POLL_S = 0.5


def add_parser(commands: Any) -> None:
    """Add ``watch`` to the subparsers ``commands``."""
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
        "headers": decode.header_json(headers),
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
    # What a dead letter's or a request's line keeps of the record, as record_json has it.
    kept = {**where, "key": text_or_repr(msg.key()), "headers": decode.header_json(headers)}
    kind = decode.kind_of(msg.topic(), topics, headers)
    try:
        if kind is decode.RecordKind.EVENTS:
            events = decode.events_of(msg.value(), headers)
            if not events:  # a line all the same: a watch counts records
                return [{**record_json(msg), "decode_error": "a timer-events record with no events"}]
            return [{**where, **decode.event_json(e)} for e in events]
        if kind is decode.RecordKind.DEAD_LETTER:
            return [{**kept, **decode.dead_letter_json(msg.value(), headers)}]
        if kind is decode.RecordKind.REQUEST:
            return [{**kept, "request": decode.request_json(msg.value(), headers)}]
    except ValueError as exc:
        return [{**record_json(msg), "decode_error": str(exc)}]
    return [record_json(msg)]


def _watch(args: argparse.Namespace) -> int:
    common = connect.common()
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
            raise connect.unreachable(common, exc) from exc
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
