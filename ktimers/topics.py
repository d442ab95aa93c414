"""Create and verify the service's topics.

``oscillator``, ``timer-request`` and the extra ingress topics
(``TIMERS_INGRESS_TOPICS``) must have the same partition count: a tick in
partition p advances the watermark of the timers requested in partition p, and the
Faust worker co-partitions these topics (and the timer table) on that number.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ktimers.config import CommonConfig, KafkaConfig
from ktimers.errors import BrokersUnreachableError, MissingTopicError, TopicLayoutError

log = logging.getLogger(__name__)

# Ticks are worthless once processed: after an outage the first new tick fires
# everything that became due, so an hour of ticks is plenty.
OSCILLATOR_RETENTION_MS = str(60 * 60 * 1000)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(common: CommonConfig) -> list[TopicSpec]:
    t = common.topics
    return [
        TopicSpec(t.oscillator, t.partitions, {"retention.ms": OSCILLATOR_RETENTION_MS}),
        TopicSpec(t.request, t.partitions, {}),
        TopicSpec(t.events, t.partitions, {}),
        TopicSpec(t.dlq, t.partitions, {}),
        # Extra ingress topics feed the same table partitions as `timer-request`.
        *(TopicSpec(name, t.partitions, {}) for name, _ in t.ingress),
    ]


def admin_client(common: CommonConfig) -> AdminClient:
    return AdminClient(common.kafka.librdkafka())


#: Where a quiet client's own log lines go: nowhere.
_SILENT = logging.getLogger("ktimers.librdkafka.quiet")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


def quiet(conf: Mapping[str, str | int | float | bool]) -> dict[str, Any]:
    """``conf`` for a client that logs nothing itself: librdkafka writes a line per failed
    connection attempt, which buries the one line that says what is wrong (the error raised,
    or a service's line saying what it waits for). Both settings: with ``log_level`` alone,
    lines still reached stderr once Faust was imported."""
    return {**conf, "log_level": 0, "logger": _SILENT}


def quiet_admin_client(kafka: KafkaConfig) -> AdminClient:
    """An admin client that logs nothing itself (:func:`quiet`)."""
    return AdminClient(quiet(kafka.librdkafka()))


def unreachable(
    kafka: KafkaConfig, reason: object, timeout_s: float | None = None
) -> BrokersUnreachableError:
    """The error saying the brokers did not answer, and what to check."""
    within = "" if timeout_s is None else f" within {timeout_s:g}s"
    return BrokersUnreachableError(
        f"cannot reach Kafka at {kafka.bootstrap_servers}{within} ({kafka_reason(reason)}). "
        "Check KAFKA_BOOTSTRAP_SERVERS, the KAFKA_* security settings and that the brokers are up."
    )


def kafka_reason(reason: object) -> str:
    """The librdkafka text of an error or exception, without the KafkaError{...} wrapping."""
    if isinstance(reason, KafkaException) and reason.args:
        reason = reason.args[0]
    text = getattr(reason, "str", None)
    return str(text()) if callable(text) else str(reason)


def partition_counts(
    admin: AdminClient, names: list[str], kafka: KafkaConfig, timeout_s: float = 10.0
) -> dict[str, int]:
    """Partition count of each existing topic among ``names`` (missing ones are absent).

    Raises :class:`BrokersUnreachableError` when the brokers do not answer within ``timeout_s``.
    """
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise unreachable(kafka, exc, timeout_s) from exc
    counts = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is not None and topic.error is None:
            counts[name] = len(topic.partitions)
    return counts


def create_topics(
    common: CommonConfig,
    admin: AdminClient | None = None,
    timeout_s: float = 30.0,
    callback_topics: Sequence[str] = (),
) -> list[str]:
    """Create the missing topics with the configured partition count; return those created.

    ``callback_topics``: callback topics to create too (the worker never creates one).
    Existing topics are left alone, then the whole layout is verified, so running
    this against a half-set-up cluster either completes it or says what is wrong.
    """
    if admin is None:  # not `or`: a client with nothing queued has len() 0, so is falsy
        admin = admin_client(common)
    partitions = common.topics.partitions
    specs = [*topic_specs(common), *(TopicSpec(name, partitions, {}) for name in callback_topics)]
    existing = partition_counts(admin, [s.name for s in specs], common.kafka, timeout_s)
    missing = [s for s in specs if s.name not in existing]
    created = []
    if missing:
        replication = common.kafka.settings.replication_factor
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, replication, config=s.config) for s in missing],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
                log.info("created topic %s", name)
            except KafkaException as exc:
                if exc.args and getattr(exc.args[0], "code", lambda: None)() == 36:  # TOPIC_ALREADY_EXISTS
                    continue
                raise TopicLayoutError(f"could not create topic {name!r}: {exc}") from exc
    verify_topics(common, admin=admin, timeout_s=timeout_s)
    return created


def verify_topics(common: CommonConfig, admin: AdminClient | None = None, timeout_s: float = 10.0) -> int:
    """Check the topics exist and are co-partitioned; return the partition count.

    Raises :class:`TopicLayoutError` with the command that fixes the problem (a
    :class:`MissingTopicError` when a topic does not exist), :class:`BrokersUnreachableError`
    when the brokers do not answer.
    """
    if admin is None:  # not `or`: a client with nothing queued has len() 0, so is falsy
        admin = admin_client(common)
    t = common.topics
    ingress = [name for name, _ in t.ingress]
    names = [t.oscillator, t.request, t.events, t.dlq, *ingress]
    counts = partition_counts(admin, names, common.kafka, timeout_s)
    missing = [n for n in names if n not in counts]
    if missing:
        raise MissingTopicError(
            f"missing topic(s) {', '.join(missing)} on {common.kafka.bootstrap_servers}. "
            f"Create them with: timers topics create --partitions {t.partitions}"
        )
    if counts[t.oscillator] != counts[t.request]:
        raise TopicLayoutError(
            f"topic {t.oscillator!r} has {counts[t.oscillator]} partitions but {t.request!r} has "
            f"{counts[t.request]}: they must be equal, because a tick in partition p drives the "
            f"timers of partition p. Recreate {t.oscillator!r} with {counts[t.request]} partitions "
            f"(ticks are disposable): delete it, then run "
            f"`timers topics create --partitions {counts[t.request]}`."
        )
    for name in ingress:
        if counts[name] != counts[t.oscillator]:
            raise TopicLayoutError(
                f"ingress topic {name!r} has {counts[name]} partitions but {t.oscillator!r} has "
                f"{counts[t.oscillator]}: they must be equal, because a tick in partition p drives the "
                f"timers requested in partition p of every request topic. Recreate {name!r} with "
                f"{counts[t.oscillator]} partitions, or list a topic that has them in TIMERS_INGRESS_TOPICS."
            )
    return counts[t.request]
