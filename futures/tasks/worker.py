"""``timers-tasks MODULE[:ATTR]``: the task worker — consume task calls, run registered tasks.

It imports ``MODULE`` (which registers its tasks on a :class:`TaskRegistry`,
found as ``ATTR``, default ``tasks``), joins the consumer group
``TIMERS_TASKS_GROUP`` on ``TIMERS_TASKS_TOPIC`` and runs each call as it
arrives. A record's offset is committed only after its task ran, or its retry
timer or dead letter was acknowledged by the broker: at least once.

No record stops it: whatever it cannot read as a call (not JSON, nested too
deep, unreadable headers...) is dead-lettered with its reason and committed,
and a dead letter too large for the producer is cut down to fit
(``kt-truncated``, ``kt-original-size``; see :mod:`ktimers.deadletter`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from futures.client.guard import TokenGuard
from futures.ingress.records import SourceRecord
from futures.tasks.codec import TaskCall
from futures.tasks.config import TASKS_ENV, TaskConfig
from futures.tasks.errors import TaskError, UnschedulableRetry
from futures.tasks.registry import TaskRegistry
from futures.tasks.runner import DeadLetter, TaskRunner
from ktimers.cli import Parser, command_parser, parse_args
from ktimers.config import SHARED_ENV, CommonConfig
from ktimers.deadletter import dead_letter, short
from ktimers.errors import DeliveryError, TimersError
from ktimers.shutdown import StopFlag
from ktimers.wire import (
    H_ERROR,
    H_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    message_headers,
)

log = logging.getLogger("futures.tasks")

H_TASK = "kt-task"
H_ATTEMPTS = "kt-attempts"
READY = "task worker ready"
#: The dead-letter producer's ``message.max.bytes`` (librdkafka's default): letters are cut to fit it.
MAX_RECORD_BYTES = 1_000_000

Headers = list[tuple[str, str | bytes | None]]


def ensure_topics(common: CommonConfig, config: TaskConfig, timeout_s: float = 30.0) -> list[str]:
    """Create the task topic and its dead-letter topic when missing; return those created."""
    admin = AdminClient(common.kafka.librdkafka())
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [name for name in (config.topic, config.dlq) if name not in existing]
    if not missing:
        return []
    replication = common.kafka.settings.replication_factor
    futures = admin.create_topics(
        [NewTopic(name, common.topics.partitions, replication) for name in missing],
        operation_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise TaskError(f"could not create topic {name!r}: {exc}") from exc
    return created


def _record(msg: Message) -> tuple[SourceRecord, str]:
    """The record, and why its headers could not be read ("" when they could)."""
    problem = ""
    headers = message_headers(msg)
    if headers is None:
        headers = ()
        problem = "its headers cannot be read: a header key is not UTF-8"
    record = SourceRecord(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=msg.key(),
        value=msg.value(),
        headers=headers,
    )
    return record, problem


def dead_letter_record(letter: DeadLetter, max_bytes: int) -> tuple[bytes | None, bytes | None, Headers]:
    """Key, value and headers of the dead letter of ``letter``: the record as it was, and why,
    cut down to ``max_bytes`` when it would not fit (see :func:`ktimers.deadletter.dead_letter`)."""
    record = letter.record
    ours = [
        (H_REASON, _text(letter.reason)),
        (H_ERROR, _text(short(letter.error))),
        (H_TASK, _text(short(letter.task))),
        (H_ATTEMPTS, str(letter.attempts).encode()),
        (H_SOURCE_TOPIC, _text(record.topic)),
        (H_SOURCE_PARTITION, str(record.partition).encode()),
        (H_SOURCE_OFFSET, str(record.offset).encode()),
    ]
    key, value, headers = dead_letter(record.key, record.value, record.headers, ours, max_bytes)
    return key, value, list(headers)


def _text(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")


class TaskWorker:
    """Consumes the task topic and runs each call through a :class:`TaskRunner`."""

    def __init__(
        self,
        registry: TaskRegistry,
        *,
        common: CommonConfig | None = None,
        config: TaskConfig | None = None,
        guard: TokenGuard | None = None,
    ) -> None:
        self.registry = registry
        self.common = common or registry.common
        self.config = config or registry.config
        self._producer = Producer(
            {
                **self.common.kafka.librdkafka(),
                "enable.idempotence": True,
                "acks": "all",
                "message.max.bytes": MAX_RECORD_BYTES,
            }
        )
        self._errors: list[str] = []
        self.runner = TaskRunner(registry, self._schedule_retry, self._dead_letter, guard=guard)
        self.assigned = False

    def _schedule_retry(self, call: TaskCall, delay_s: float, timer_id: str) -> None:
        try:
            self.registry.client.schedule(
                self.config.topic, call.task, call.encode(), delay=delay_s, id=timer_id
            )
        except DeliveryError as exc:
            cause = exc.__cause__
            if isinstance(cause, KafkaException) and cause.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise UnschedulableRetry(f"the call is too large for a retry timer: {exc}") from exc
            raise

    def _dead_letter(self, letter: DeadLetter) -> None:
        key, value, headers = dead_letter_record(letter, MAX_RECORD_BYTES)

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._errors.append(err.str())

        while True:
            try:
                self._producer.produce(self.config.dlq, value, key, headers=headers, on_delivery=on_delivery)
                return
            except BufferError:
                self._producer.poll(0.1)  # the local queue is full: serve delivery reports to make room
            except KafkaException as exc:
                raise DeliveryError(f"could not produce a dead letter to {self.config.dlq!r}: {exc}") from exc

    def _make_durable(self) -> None:
        """Wait until retries and dead letters of the handled records are acknowledged."""
        self.registry.client.flush()
        while self._producer.flush(1.0) > 0:
            pass
        if self._errors:
            first, more = self._errors[0], len(self._errors) - 1
            self._errors.clear()
            raise DeliveryError(f"dead letter not delivered to {self.config.dlq!r}: {first} (+{more} more)")

    def run(self, stop: Callable[[], bool], batch: int = 500, poll_s: float = 0.2) -> None:
        """Consume and run task calls until ``stop()`` is true."""
        settings = self.common.kafka.settings
        consumer = Consumer(
            {
                **self.common.kafka.librdkafka(),
                "group.id": self.config.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": int(settings.session_timeout_s * 1000),
                "heartbeat.interval.ms": int(settings.heartbeat_s * 1000),
                "fetch.wait.max.ms": 100,
            }
        )

        def on_assign(_consumer: Consumer, partitions: list[Any]) -> None:
            if not self.assigned:
                self.assigned = True
                log.info("%s: %d partitions of %s", READY, len(partitions), self.config.topic)

        consumer.subscribe([self.config.topic], on_assign=on_assign)
        try:
            while not stop():
                messages = consumer.consume(batch, timeout=poll_s)
                handled = False
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("task topic: %s", err.str())
                        continue
                    record, problem = _record(msg)
                    if problem:
                        # Without its headers its id and token are unknown: never run it.
                        self.runner.reject(record, "undecodable", problem)
                    else:
                        self.runner.handle(record)
                    handled = True
                if handled:
                    self._make_durable()
                    consumer.commit(asynchronous=False)
        finally:
            consumer.close()
            self.runner.close()
            self.registry.close()
            self._producer.flush(10)


def load_registry(spec: str) -> TaskRegistry:
    """``"package.module[:attr]"`` → the TaskRegistry it defines (attribute ``tasks`` by default)."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskError(f"cannot import {module_name!r}: {exc}") from exc
    registry = getattr(module, attr or "tasks", None)
    if not isinstance(registry, TaskRegistry):
        raise TaskError(f"{module_name}:{attr or 'tasks'} is not a TaskRegistry")
    return registry


def build_parser() -> Parser:
    parser = command_parser(
        "timers-tasks",
        "The task worker: consumes task calls and runs the tasks registered in MODULE.",
        [("environment, shared", SHARED_ENV), ("environment, tasks", TASKS_ENV)],
    )
    parser.add_argument("registry", help="MODULE[:ATTR] defining the TaskRegistry (ATTR default: tasks)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    logging.basicConfig(
        level=os.environ.get("TIMERS_LOG_LEVEL", "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The module is the user's code: make `timers-tasks myapp.tasks` work from its directory.
    sys.path.insert(0, os.getcwd())
    try:
        registry = load_registry(args.registry)
        ensure_topics(registry.common, registry.config)
        worker = TaskWorker(registry)
    except TimersError as exc:
        print(f"timers-tasks: {exc}", file=sys.stderr)
        return 2
    stop = StopFlag()
    stop.install()
    log.info("task worker: tasks %s from %s", ", ".join(registry) or "(none)", registry.config.topic)
    worker.run(lambda: stop.requested)
    log.info("task worker stopped (%s)", stop.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
