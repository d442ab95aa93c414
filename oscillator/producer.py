"""Building ticks and sending them to every partition; delivery reports feed metrics and readiness.

Lost ticks are counted, logged and reflected in ``/readyz``, but do not stop the
oscillator: the next second's tick supersedes a lost one (a worker fires all that
is due up to the tick it sees), so crashing would turn a broker hiccup into a gap
on every partition. A producer the brokers keep refusing is another matter: an
idempotent producer that hit a fatal error sends nothing more, and one whose
producer id the broker fenced (seen after a broker was paused past the delivery
timeout) is refused on every send and never recovers by itself. Either is replaced
here by a new producer, in the process: a restart would only do the same, later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ktimers.config import KafkaConfig
from ktimers.producer import DeliveryCallback, ProducerLike
from ktimers.wire import Tick, encode_second_key
from oscillator.clock import Clock
from oscillator.health import Monotonic, Readiness
from oscillator.metrics import OscillatorMetrics

log = logging.getLogger(__name__)

# Ticks are tiny and go out together once a second: a few ms of linger batches
# each second's records per broker without delaying the tick noticeably.
LINGER_MS = 5
# A tick this old has been superseded many times over; failing it soon shows an
# outage in the error counter instead of librdkafka's 5-minute default.
MESSAGE_TIMEOUT_MS = 10_000
#: A producer whose every delivery report for this long was a broker's refusal is replaced
#: (seconds): a refusal that lasts seconds is not a leader moving, which retries ride out.
REFUSED_FOR_S = 3.0


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

    ``producers`` makes a producer: the first at once, a new one whenever the current one
    hit a fatal error or was refused by the brokers for :data:`REFUSED_FOR_S`. Delivery
    reports arrive inside :meth:`poll` and :meth:`flush`, on the caller's thread.
    """

    def __init__(
        self,
        producers: Callable[[], ProducerLike],
        topic: str,
        source: str,
        metrics: OscillatorMetrics,
        readiness: Readiness,
        clock: Clock = time.time,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        self._producers = producers
        self._producer = producers()
        self._topic = topic
        self._source = source
        self._metrics = metrics
        self._readiness = readiness
        self._clock = clock
        self._monotonic = monotonic
        #: Bumped with each new producer: reports of a replaced one are not about the current one.
        self._generation = 0
        self._fatal: KafkaError | None = None
        #: Since when every report was a refusal (monotonic seconds), and the last refusal.
        self._refused_since: float | None = None
        self._refusal: KafkaError | None = None
        #: Since when ticks fail (monotonic seconds), and how many tick records since: logged once.
        self._failing_since: float | None = None
        self._lost = 0
        #: How many times the producer was replaced.
        self.replaced = 0

    def send(self, second: int, partitions: int) -> None:
        """Produce the tick for epoch ``second`` to partitions ``0 .. partitions-1``.

        The caller guarantees the wall clock has reached ``second``; ``emitted_ms``
        is stamped from the clock (epoch milliseconds). A producer that cannot send any
        more is replaced first.
        """
        self._replace_if_refused()
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
                self._failed(second, partition, str(exc))

    def poll(self) -> None:
        """Serve pending delivery reports without blocking."""
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` seconds for outstanding ticks; return how many are still undelivered."""
        return self._producer.flush(timeout_s)

    def _on_delivery(self, second: int, partition: int) -> DeliveryCallback:
        generation = self._generation

        def report(err: KafkaError | None, _msg: Message) -> None:
            if generation != self._generation:
                return  # a replaced producer's record, purged or late: the new producer's count
            if err is None:
                self._delivered(second)
                return
            if err.fatal() and self._fatal is None:
                self._fatal = err
            if err.code() > 0:  # the broker's error code: it answered, and refused
                if self._refused_since is None:
                    self._refused_since = self._monotonic()
                self._refusal = err
            self._failed(second, partition, err.str())

        return report

    def _delivered(self, second: int) -> None:
        self._metrics.delivered(second)
        self._readiness.delivered()
        self._refused_since = self._refusal = None
        if self._failing_since is not None:
            log.warning(
                "ticks are acknowledged again, after %.1fs; %d tick record(s) were lost meanwhile",
                self._monotonic() - self._failing_since,
                self._lost,
            )
            self._failing_since, self._lost = None, 0

    def _failed(self, second: int, partition: int, reason: str) -> None:
        self._metrics.failed()
        self._lost += 1
        if self._failing_since is None:
            # One line for an outage, not one per partition per second: the count is in
            # timers_oscillator_produce_errors_total and in the line that ends it.
            self._failing_since = self._monotonic()
            log.error(
                "tick for second %d to %s[%d] not delivered: %s; further failures are counted, "
                "not logged, until ticks are acknowledged again",
                second, self._topic, partition, reason,
            )  # fmt: skip

    def _replace_if_refused(self) -> None:
        if self._fatal is not None:
            reason = f"it hit a fatal error: {self._fatal.str()}"
        elif self._refused_since is not None and self._monotonic() - self._refused_since >= REFUSED_FOR_S:
            assert self._refusal is not None  # noqa: S101 - set with _refused_since
            reason = f"the brokers refused its ticks for {REFUSED_FOR_S:g}s: {self._refusal.str()}"
        else:
            return
        log.warning("replacing the tick producer: %s", reason)
        old = self._producer
        self._generation += 1
        self._fatal = self._refused_since = self._refusal = None
        self.replaced += 1
        self._producer = self._producers()
        # Its queued ticks are stale by now; what it would still deliver, a worker treats as
        # the duplicate it is. Its reports are served here, to the generation they belong to.
        purge = getattr(old, "purge", None)
        if callable(purge):
            purge()
        old.flush(0)
