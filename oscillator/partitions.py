"""How many partitions the oscillator topic has: read at start, re-read in the background.

Every partition needs its own tick (a worker only sees the partitions it owns),
so the count must follow the topic if an operator adds partitions. The re-read
runs in its own thread because a metadata request can block for seconds when the
broker is slow, and the tick loop must not wait for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ktimers.config import KafkaConfig
from ktimers.errors import MissingTopicError, TimersError, TopicLayoutError
from ktimers.topics import quiet_admin_client, unreachable

log = logging.getLogger(__name__)


def admin_client(kafka: KafkaConfig) -> AdminClient:
    """An admin client for metadata reads (it logs nothing: the reads' errors say it all)."""
    return quiet_admin_client(kafka)


def partition_reader(
    admin: AdminClient, topic: str, kafka: KafkaConfig, timeout_s: float = 5.0
) -> Callable[[], int]:
    """A function returning the partition count of ``topic``.

    It raises :class:`MissingTopicError` when the topic does not exist and
    :class:`BrokersUnreachableError` when the brokers do not answer within ``timeout_s`` seconds.
    Metadata is requested for all topics: asking for the one topic would let a
    broker with auto-creation on create it with its default partition count.
    """
    bootstrap = kafka.bootstrap_servers

    def read() -> int:
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise unreachable(kafka, exc, timeout_s) from exc
        found = metadata.topics.get(topic)
        if found is None:
            raise MissingTopicError(
                f"topic {topic!r} does not exist on {bootstrap}. "
                f"Create the service's topics with: timers topics create"
            )
        if found.error is not None:
            raise TopicLayoutError(f"topic {topic!r} on {bootstrap} is not usable: {found.error}")
        return len(found.partitions)

    return read


class PartitionWatcher:
    """The current partition count, refreshed every ``refresh_s`` seconds in a daemon thread."""

    def __init__(self, read: Callable[[], int], refresh_s: float, count: int) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._count = count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition-watcher", daemon=True)

    @property
    def count(self) -> int:
        """The partition count last read."""
        return self._count

    def start(self) -> None:
        """Keep the count fresh, in the background."""
        self._thread.start()

    def refresh(self) -> None:
        """Re-read the count; on failure keep the last one, since ticks to known partitions stay useful."""
        try:
            count = self._read()
        except TopicLayoutError as exc:
            log.error("partition refresh failed, still ticking %s partitions: %s", self._count, exc)
            return
        except TimersError as exc:
            log.warning("partition refresh failed, still ticking %s partitions: %s", self._count, exc)
            return
        if count != self._count:
            log.warning("oscillator topic now has %d partitions (was %s)", count, self._count)
            self._count = count

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_s):
            self.refresh()
