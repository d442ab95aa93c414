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
from ktimers.errors import TimersError, TopicLayoutError
from oscillator.errors import MetadataError

log = logging.getLogger(__name__)


def admin_client(kafka: KafkaConfig) -> AdminClient:
    # AdminClient's stub takes dict[str, str | int | float | bool], and dict is
    # invariant, so librdkafka()'s dict[str, str] must be copied into that type.
    conf: dict[str, str | int | float | bool] = {**kafka.librdkafka()}
    return AdminClient(conf)


def partition_reader(
    admin: AdminClient, topic: str, bootstrap: str, timeout_s: float = 10.0
) -> Callable[[], int]:
    """A function returning the partition count of ``topic``.

    It raises :class:`TopicLayoutError` when the topic does not exist and
    :class:`MetadataError` when the broker does not answer within ``timeout_s`` seconds.
    Metadata is requested for all topics: asking for the one topic would let a
    broker with auto-creation on create it with its default partition count.
    """

    def read() -> int:
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise MetadataError(
                f"cannot read the metadata of topic {topic!r} from {bootstrap} within {timeout_s:g}s: "
                f"{exc}. Check KAFKA_BOOTSTRAP_SERVERS and that the brokers are up."
            ) from exc
        found = metadata.topics.get(topic)
        if found is None:
            raise TopicLayoutError(
                f"topic {topic!r} does not exist on {bootstrap}. "
                f"Create the service's topics with: timers topics create"
            )
        if found.error is not None:
            raise TopicLayoutError(f"topic {topic!r} on {bootstrap} is not usable: {found.error}")
        return len(found.partitions)

    return read


class PartitionWatcher:
    """The current partition count, refreshed every ``refresh_s`` seconds in a daemon thread."""

    def __init__(self, read: Callable[[], int], refresh_s: float) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._count: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition-watcher", daemon=True)

    @property
    def count(self) -> int:
        """The partition count last read; :meth:`start` must have succeeded."""
        if self._count is None:
            raise RuntimeError("PartitionWatcher.start() has not succeeded yet")
        return self._count

    def start(self) -> int:
        """Read the count now (errors propagate: the service cannot tick without it), then keep it fresh."""
        self._count = self._read()
        self._thread.start()
        return self._count

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
