"""How the ``timers`` commands reach Kafka: the config from the environment, the client, and
the one-line errors that say what to check when the brokers do not answer."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from futures.client import TimerClient
from futures.console.output import kafka_log
from ktimers.config import CommonConfig
from ktimers.errors import TimersError


def common() -> CommonConfig:
    return CommonConfig.from_env()


def client(config: CommonConfig, delivery_timeout_s: float) -> TimerClient:
    """A client whose records fail after ``delivery_timeout_s`` (seconds) undelivered."""
    return TimerClient(
        config,
        producer_config={"message.timeout.ms": max(1, round(delivery_timeout_s * 1000)), "logger": kafka_log},
    )


def send_and_wait(timers: TimerClient, delivery_timeout_s: float) -> None:
    # message.timeout.ms makes librdkafka fail the record itself; the margin lets
    # that precise error arrive before flush gives up.
    timers.close(timeout=delivery_timeout_s + 5.0)


def reason(exc: KafkaException) -> str:
    """The librdkafka error text, without the KafkaError{...} wrapping."""
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def unreachable(config: CommonConfig, exc: KafkaException) -> TimersError:
    return TimersError(
        f"cannot reach Kafka at {config.kafka.bootstrap_servers} ({reason(exc)}). "
        "Check KAFKA_BOOTSTRAP_SERVERS and that the brokers are running."
    )


def probe(config: CommonConfig) -> AdminClient:
    """An admin client known to reach Kafka, so later steps fail on their own merits."""
    conf: dict[str, Any] = {**config.kafka.librdkafka(), "logger": kafka_log}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise unreachable(config, exc) from exc
    return admin


def service_topics(config: CommonConfig) -> list[str]:
    """The service's own topics, named as the commands print them."""
    t = config.topics
    return [t.oscillator, t.request, t.events, t.dlq, *(f"{name} ({fmt.value})" for name, fmt in t.ingress)]
