"""Building ticks and sending them to every partition; delivery reports feed metrics and health.

Lost ticks are counted, logged and reflected in ``/healthz``, but do not stop the
oscillator: the next second's tick supersedes a lost one (a worker fires all that
is due up to the tick it sees), so crashing would turn a broker hiccup into a gap
on every partition. A *fatal* producer error is different: the idempotent producer
cannot send anything after it, so it is raised from the next :meth:`TickProducer.send`
and ends the process, and the orchestrator restarts it with a fresh producer.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ktimers.config import KafkaConfig
from ktimers.errors import DeliveryError
from ktimers.producer import DeliveryCallback, ProducerLike
from ktimers.wire import Tick, encode_second_key
from oscillator.clock import Clock
from oscillator.health import Liveness
from oscillator.metrics import OscillatorMetrics

log = logging.getLogger(__name__)

# Ticks are tiny and go out together once a second: a few ms of linger batches
# each second's records per broker without delaying the tick noticeably.
LINGER_MS = 5
# A tick this old has been superseded many times over; failing it soon shows an
# outage in the error counter instead of librdkafka's 5-minute default.
MESSAGE_TIMEOUT_MS = 10_000


def _log_client_error(err: KafkaError) -> None:
    # Connection-level trouble; librdkafka retries on its own and per-tick
    # failures show up in delivery reports.
    if err.fatal():
        log.error("kafka producer fatal error: %s", err.str())
    else:
        log.warning("kafka producer error: %s", err.str())


def build_producer(kafka: KafkaConfig, instance: str) -> Producer:
    """An idempotent confluent-kafka producer for ticks."""
    return Producer(
        {
            **kafka.librdkafka(),
            "client.id": f"timers-oscillator-{instance}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            # The producer defaults to true: a deleted oscillator topic would come
            # back with the broker's default partition count, out of step with
            # timer-request. Better to fail deliveries and let an operator recreate it.
            "allow.auto.create.topics": False,
            "error_cb": _log_client_error,
            "logger": logging.getLogger("librdkafka"),
        }
    )


class TickProducer:
    """Sends one tick per partition for a second and tracks the delivery reports.

    Delivery reports arrive inside :meth:`poll` and :meth:`flush`, on the caller's thread.
    """

    def __init__(
        self,
        producer: ProducerLike,
        topic: str,
        source: str,
        metrics: OscillatorMetrics,
        liveness: Liveness,
        clock: Clock = time.time,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._source = source
        self._metrics = metrics
        self._liveness = liveness
        self._clock = clock
        self._fatal: KafkaError | None = None

    def send(self, second: int, partitions: int) -> None:
        """Produce the tick for epoch ``second`` to partitions ``0 .. partitions-1``.

        The caller guarantees the wall clock has reached ``second``; ``emitted_ms``
        is stamped from the clock (epoch milliseconds). Raises :class:`DeliveryError`
        once the producer has hit a fatal error.
        """
        self._raise_if_fatal()
        tick = Tick(second=second, source=self._source, emitted_ms=int(self._clock() * 1000))
        value = tick.SerializeToString()
        key = encode_second_key(second)
        for partition in range(partitions):
            try:
                self._producer.produce(
                    self._topic,
                    value=value,
                    key=key,
                    partition=partition,
                    on_delivery=self._on_delivery(second, partition),
                )
            except BufferError as exc:
                # The local queue is full because the broker has been unreachable
                # for a while; this tick is lost, a later one replaces it.
                self._failed(second, partition, f"local producer queue full: {exc}")
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if error is not None and error.fatal():
                    self._fatal = self._fatal or error
                    self._raise_if_fatal()
                self._failed(second, partition, str(exc))

    def poll(self) -> None:
        """Serve pending delivery reports without blocking."""
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` seconds for outstanding ticks; return how many are still undelivered."""
        return self._producer.flush(timeout_s)

    def _on_delivery(self, second: int, partition: int) -> DeliveryCallback:
        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self._metrics.delivered(second)
                self._liveness.delivered()
                return
            if err.fatal() and self._fatal is None:
                self._fatal = err
            self._failed(second, partition, err.str())

        return report

    def _failed(self, second: int, partition: int, reason: str) -> None:
        self._metrics.failed()
        log.error("tick for second %d to %s[%d] not delivered: %s", second, self._topic, partition, reason)

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise DeliveryError(
                f"kafka producer hit a fatal error, no tick can be sent any more: {self._fatal.str()}. "
                "Restarting the oscillator creates a new producer."
            )
