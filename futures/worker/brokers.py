"""Whether the worker reaches its brokers: for ``/readyz`` and for the log of an outage.

A broker outage is no reason to restart a worker (a restarted one would find the same
brokers, and its tables are on its disk): it stays live, reports not ready, says once that
it lost the brokers and once that they are back, and its Kafka clients reconnect by
themselves. What tells is a small metadata request, in a thread of its own every
:data:`PERIOD_S`: its answer does not depend on traffic, and it never blocks the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ktimers.config import KafkaConfig
from ktimers.topics import kafka_reason, quiet

log = logging.getLogger("futures.worker.brokers")

#: Seconds between two metadata requests; and how long one may take before the brokers count as lost.
PERIOD_S = 2.0
TIMEOUT_S = 5.0


class MetadataSource(Protocol):
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> object: ...


class BrokerWatch:
    """Reachable until a metadata request for ``topic`` fails; reachable again when one succeeds."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topic: str,
        admin: MetadataSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bootstrap = kafka.bootstrap_servers
        self._topic = topic
        # Quiet (the transitions are logged here, once) and never creating the topic it asks for.
        if admin is None:  # not `or`: a client with nothing queued has len() 0, so is falsy
            admin = AdminClient(quiet({**kafka.librdkafka(), "allow.auto.create.topics": False}))
        self._admin = admin
        self._clock = clock
        self._lost_at: float | None = None
        self._reason = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-watch", daemon=True)

    @property
    def reachable(self) -> bool:
        return self._lost_at is None

    @property
    def reason(self) -> str:
        """Why the brokers count as lost ("" while reachable)."""
        return "" if self._lost_at is None else self._reason

    def check(self) -> None:
        """One metadata request; logs a change of state."""
        try:
            self._admin.list_topics(self._topic, timeout=TIMEOUT_S)
        except KafkaException as exc:
            self._reason = f"cannot reach Kafka at {self._bootstrap}: {kafka_reason(exc)}"
            if self._lost_at is None:
                self._lost_at = self._clock()
                log.warning(
                    "futures worker lost its brokers: %s. It keeps what it holds, stays live and not "
                    "ready, and goes on when they answer",
                    self._reason,
                )
            return
        if self._lost_at is not None:
            log.warning(
                "futures worker reaches its brokers at %s again, after %.1fs",
                self._bootstrap,
                self._clock() - self._lost_at,
            )
            self._lost_at = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self.check()
