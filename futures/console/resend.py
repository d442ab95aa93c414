"""``timers deadletter resend``: a dead letter's request, sent again to the topic it came from.

A dead letter is the rejected record as it was sent, plus the worker's ``kt-*`` headers
(:mod:`ktimers.deadletter`, docs/wire.md#timer-request-dlq); once its cause is fixed (the
callback topic created, a limit raised) the same key, value and headers, less the worker's,
go back to ``kt-source-topic``. Refused: a dead letter the worker cut to fit (``kt-truncated``:
what is left is not the request), and ``unreadable-timer`` (the bytes of a damaged table, no
request at all).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from google.protobuf.message import DecodeError

from futures.console.decode import original_headers
from ktimers.config import CommonConfig
from ktimers.deadletter import H_TRUNCATED
from ktimers.errors import TimersError
from ktimers.producer import RecordHeaders
from ktimers.wire import (
    H_REASON,
    H_SOURCE_TOPIC,
    Future,
    KafkaHeaders,
    header_value,
    message_headers,
    text_or_repr,
)

#: The reason of a dead letter that holds a table's bytes, not a request.
UNREADABLE_TIMER = "unreadable-timer"
#: A timer whose callback topic refused it when due: its value is the ``Future``.
CALLBACK_UNDELIVERABLE = "callback-undeliverable"
#: A FutureBatch dead-lettered whole: its valid timers were scheduled when it was first read.
BATCH_INVALID = "batch-invalid"


class ResendError(TimersError):
    """The dead letter cannot be resent as asked; the message says why and what to do."""


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: KafkaHeaders

    @property
    def reason(self) -> str | None:
        return text_or_repr(header_value(self.headers, H_REASON))


@dataclass(frozen=True)
class Resend:
    """What goes back: the original record and where to."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: RecordHeaders


def plan(letter: DeadLetter, to: str | None) -> Resend:
    """The record to send for ``letter``, to ``to`` or else where it came from."""
    if header_value(letter.headers, H_REASON) is None:
        raise ResendError(
            f"{letter.topic}[{letter.partition}]@{letter.offset} is not a dead letter "
            f"(no {H_REASON} header): check --partition and --offset"
        )
    if letter.reason == UNREADABLE_TIMER:
        raise ResendError(
            f"a {UNREADABLE_TIMER} dead letter holds a damaged table's bytes, not a request: "
            "nothing to resend"
        )
    cut = header_value(letter.headers, H_TRUNCATED)
    if cut is not None:
        raise ResendError(
            f"the worker cut this dead letter to fit ({H_TRUNCATED}: {text_or_repr(cut)}): what is left is "
            "not the request that was sent; send it again from its producer"
        )
    source = text_or_repr(header_value(letter.headers, H_SOURCE_TOPIC))
    target = to or source
    if not target:
        raise ResendError(f"the dead letter names no {H_SOURCE_TOPIC}: give --to TOPIC")
    headers: RecordHeaders = list(original_headers(letter.headers))
    return Resend(target, letter.key, letter.value, headers)


def callback_topic_of(letter: DeadLetter) -> str | None:
    """The callback topic of a ``callback-undeliverable`` dead letter's timer; None for another
    reason, or a value that is no ``Future``."""
    if letter.reason != CALLBACK_UNDELIVERABLE:
        return None
    try:
        return Future.FromString(letter.value or b"").callBackTopic or None
    except (DecodeError, RuntimeWarning):
        return None


def missing_topics(common: CommonConfig, topics: list[str], timeout_s: float, logger: Any) -> list[str]:
    """Those of ``topics`` the cluster does not have (all topics listed: asking for one by
    name can create it)."""
    admin = AdminClient({**common.kafka.librdkafka(), "logger": logger})
    try:
        have = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise TimersError(f"cannot list the topics of {common.kafka.bootstrap_servers}: {exc}") from exc
    return [t for t in topics if t not in have]


def read_one(
    common: CommonConfig, topic: str, partition: int, offset: int, timeout_s: float, logger: Any
) -> DeadLetter:
    """The record at ``topic[partition]@offset``; :class:`ResendError` when there is none."""
    consumer = Consumer(
        {
            **common.kafka.librdkafka(),
            "group.id": f"timers-cli-{uuid.uuid4().hex[:12]}",  # assign() only: nothing committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # An offset out of the partition's range is an error, not a jump to its end.
            "auto.offset.reset": "error",
            "logger": logger,
        }
    )
    where = f"{topic}[{partition}]@{offset}"
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or partition not in info.partitions:
            have = "" if info is None else f" (it has partitions 0 to {len(info.partitions) - 1})"
            raise ResendError(f"{where}: no such topic partition{have}: check --topic and --partition")
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            found = _record(msg, offset, where)
            if found is not None:
                headers = message_headers(found)
                if headers is None:
                    raise ResendError(
                        f"{where}: a header key is not UTF-8: this is no dead letter of a worker"
                    )
                return DeadLetter(topic, partition, offset, found.key(), found.value(), headers)
        raise ResendError(
            f"{where}: no record at that offset came within {timeout_s:g}s: check --offset, "
            "and that the brokers are up"
        )
    except KafkaException as exc:
        raise ResendError(f"cannot read {where} on {common.kafka.bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def _record(msg: Message, offset: int, where: str) -> Message | None:
    err = msg.error()
    if err is not None:
        if err.code() == KafkaError._PARTITION_EOF:
            raise ResendError(
                f"{where}: there is no record at that offset: check --offset (the end is {msg.offset()})"
            )
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            raise ResendError(
                f"{where}: there is no record at that offset (out of the partition's range): check --offset"
            )
        if err.fatal():
            raise KafkaException(err)
        return None
    if msg.offset() != offset:
        raise ResendError(f"{where}: there is no record at that offset any more (the next is {msg.offset()})")
    return msg


def send(common: CommonConfig, resend: Resend, timeout_s: float, logger: Any) -> tuple[int, int]:
    """Produce ``resend``; its (partition, offset) once Kafka acknowledged it."""
    producer = Producer(
        {
            **common.kafka.librdkafka(),
            "enable.idempotence": True,
            "message.timeout.ms": max(1, round(timeout_s * 1000)),
            "logger": logger,
        }
    )
    result: list[tuple[int, int]] = []
    failure: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failure.append(err)
        else:
            result.append((msg.partition() or 0, msg.offset() or 0))

    producer.produce(resend.topic, resend.value, resend.key, headers=resend.headers, on_delivery=delivered)
    producer.flush(timeout_s + 5.0)
    if failure or not result:
        why = failure[0].str() if failure else "no acknowledgement"
        raise TimersError(f"the request was not delivered to {resend.topic!r}: {why}")
    return result[0]
