"""``helm test``: schedule one timer through the deployed service and wait for its callback.

Runs in the chart's test pod on the service image, with the release's Kafka settings in the
environment (``KAFKA_*``, ``TIMERS_TOPIC_*``), like every component. It exercises the whole path:
request topic → worker table → oscillator tick → callback on ``--topic``.

Prints one JSON line. Exit status: 0 the callback arrived, and not early; 1 it did not arrive in
time, or arrived early; 2 the test could not run (Kafka unreachable, bad settings).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from futures.client import TimerClient
from ktimers.config import CommonConfig
from ktimers.errors import TimersError
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, header_value

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
# The test topic only ever holds a few test callbacks; a day of them is plenty.
TOPIC_RETENTION_MS = str(24 * 3600 * 1000)
KAFKA_TIMEOUT_S = 15.0


class CannotRun(Exception):
    """The test could not be carried out; the message says what to check."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True, help="callback topic (created if missing)")
    parser.add_argument("--delay", type=float, default=5.0, help="the timer fires after this long, seconds")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this long, seconds")
    parser.add_argument(
        "--max-early-ms",
        type=int,
        default=1000,
        help="clock skew allowed between this pod and the worker before a callback counts as early",
    )
    return parser.parse_args(argv)


def ensure_topic(common: CommonConfig, topic: str) -> list[int]:
    """The topic's partitions, after creating it with one partition if it is missing."""
    admin = AdminClient(common.kafka.librdkafka())
    try:
        # All topics, not list_topics(topic): asking for one can auto-create it with broker defaults.
        info = admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics.get(topic)
        if info is None:
            # Replication factor -1: the broker's default.
            new = NewTopic(topic, 1, -1, config={"retention.ms": TOPIC_RETENTION_MS})
            admin.create_topics([new], operation_timeout=KAFKA_TIMEOUT_S)[topic].result()
            info = admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics.get(topic)
    except KafkaException as exc:
        raise CannotRun(
            f"cannot reach Kafka at {common.kafka.bootstrap_servers} or create topic {topic!r}: {exc}. "
            "Check the chart's kafka.* values; or create the topic and set tests.callbackTopic to it."
        ) from exc
    if info is None or info.error is not None or not info.partitions:
        raise CannotRun(f"topic {topic!r} is not usable: {info.error if info else 'missing'}")
    return sorted(info.partitions)


def schedule(common: CommonConfig, topic: str, timer_id: str, delay_s: float) -> int:
    """Send the test timer; return its due time, epoch milliseconds."""
    client = TimerClient(common)
    try:
        payload = f"helm test {timer_id}".encode()
        handle = client.schedule(topic, timer_id, payload, delay=delay_s, id=timer_id)
        client.close(timeout=KAFKA_TIMEOUT_S)
    except TimersError as exc:
        raise CannotRun(f"cannot send the timer request to {common.topics.request!r}: {exc}") from exc
    return handle.due_ms


def headers(msg: Message) -> list[tuple[str, bytes | None]]:
    """The record's headers as (name, bytes) pairs."""
    # confluent-kafka's stubs also allow a dict; a consumed record has a list.
    raw: Any = msg.headers() or []
    return [(k, v if v is None else bytes(v)) for k, v in raw]


def wait_for_callback(consumer: Consumer, timer_id: str, deadline: float) -> Message | None:
    """The callback record of ``timer_id``, or None if it has not arrived by ``deadline`` (monotonic)."""
    while time.monotonic() < deadline:
        msg = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF and err.fatal():
                raise CannotRun(f"reading the callback topic failed: {err.str()}")
            continue
        if header_value(headers(msg), H_ID) == timer_id.encode():
            return msg
    return None


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    common = CommonConfig.from_env()
    partitions = ensure_topic(common, args.topic)
    timer_id = f"helm-test-{uuid.uuid4().hex}"
    consumer = Consumer(
        {
            **common.kafka.librdkafka(),
            # assign() needs no group; librdkafka wants an id anyway. Nothing is committed.
            "group.id": timer_id,
            "enable.auto.commit": False,
        }
    )
    try:
        # From the beginning, picking our id out: no race with a fast callback, and the topic is tiny.
        consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in partitions])
        due_ms = schedule(common, args.topic, timer_id, args.delay)
        msg = wait_for_callback(consumer, timer_id, time.monotonic() + args.timeout)
    finally:
        consumer.close()
    report: dict[str, Any] = {"id": timer_id, "topic": args.topic, "due_ms": due_ms}
    if msg is None:
        report["result"] = "no callback"
        report["error"] = (
            f"no callback within {args.timeout:g}s. Check that the workers are ready (/readyz), that "
            f"an oscillator ticks (/healthz), and the dead letters on {common.topics.dlq!r}: a reason "
            "callback-topic-not-allowed means worker.allowedCallbackTopics refuses the test topic."
        )
        return EXIT_FAILED, report
    received_ms = time.time_ns() // 1_000_000
    fired_ms = int(header_value(headers(msg), H_FIRED_MS) or b"0")
    report.update(
        lateness_ms=received_ms - due_ms,
        fired_minus_due_ms=fired_ms - due_ms,
        due_header_matches=header_value(headers(msg), H_DUE_MS) == str(due_ms).encode(),
    )
    if not report["due_header_matches"]:
        report["result"] = "wrong callback"
        report["error"] = "the callback's kt-due-ms header is not the due time that was scheduled"
        return EXIT_FAILED, report
    if fired_ms < due_ms - args.max_early_ms:
        report["result"] = "early"
        report["error"] = (
            f"fired {due_ms - fired_ms} ms before its due time: check the clocks of the oscillator "
            "and worker nodes (NTP), and TIMERS_CLOCK_TOLERANCE_MS"
        )
        return EXIT_FAILED, report
    report["result"] = "ok"
    return EXIT_OK, report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        status, report = run(args)
    except (CannotRun, TimersError) as exc:
        status, report = EXIT_CANNOT_RUN, {"result": "cannot run", "error": str(exc)}
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
