"""Which callback topics exist, learnt in the background so that firing never waits for it.

librdkafka holds a record for a topic it has no metadata for until the topic
appears or ``message.timeout.ms`` passes; the engine's flush waits for every
record of a chunk, under the engine lock. One timer addressed to a topic that
does not exist would stall firing for every partition for up to 30 s, every
tick. So the engine asks :class:`CallbackTopics` first; it answers from memory:

* a topic seen in the cluster's metadata: produce;
* a topic never looked up: not now — a background lookup starts, and the
  timer stays in the table for the next tick (one tick late at most);
* a topic the lookup did not find: the timer is dead-lettered
  (``callback-undeliverable``), so the user can create the topic and resend it.

Answers are refreshed every ``refresh_s``: topics created or deleted later are seen.
On a broker that creates topics on first use, the lookup creates it, as a produce would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger(__name__)

#: Looks topics up: a name → whether it exists; None → the names of all topics.
Lookup = Callable[[str | None], bool | set[str]]


class TopicDirectory(Protocol):
    def problem(self, topic: str) -> KafkaError | None:
        """None when records can go to ``topic`` now; else why not (retriable: try on a later tick)."""
        ...


class AnyTopic:
    """Every topic exists: for tests of what comes after, and brokers that create topics on demand."""

    def problem(self, topic: str) -> KafkaError | None:
        return None


class CallbackTopics:
    def __init__(
        self,
        lookup: Lookup,
        *,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._refresh_s = refresh_s
        self._clock = clock
        # topic → (exists, when it was looked up); read on the fire path without the lock:
        # a dict read is atomic, and only the lookup thread writes.
        self._known: dict[str, tuple[bool, float]] = {}
        self._pending: set[str] = set()
        self._mutex = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="callback-topics")
        self._pool.submit(self._load_all)

    @classmethod
    def of_producer(
        cls, producer: Producer, timeout_s: float = 10.0, refresh_s: float = 30.0
    ) -> CallbackTopics:
        """Looked up through a confluent-kafka producer's metadata (``list_topics``)."""

        def lookup(topic: str | None) -> bool | set[str]:
            metadata = producer.list_topics(topic, timeout=timeout_s)
            if topic is None:
                return {name for name, meta in metadata.topics.items() if meta.error is None}
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is None:
                return meta is not None
            if meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return False
            raise KafkaException(meta.error)

        return cls(lookup, refresh_s=refresh_s)

    def problem(self, topic: str) -> KafkaError | None:
        known = self._known.get(topic)
        if known is not None:
            exists, when = known
            fresh = self._clock() - when < self._refresh_s
            if not fresh:
                self._look_up(topic)
            if exists:
                return None  # meanwhile, as it was: topics are rarely deleted
            if fresh:
                return KafkaError(
                    KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {topic!r} does not exist in the cluster"
                )
        else:
            self._look_up(topic)
        return KafkaError(
            KafkaError._UNKNOWN_TOPIC, f"looking topic {topic!r} up; trying again next tick", retriable=True
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _look_up(self, topic: str) -> None:
        with self._mutex:
            if topic in self._pending:
                return
            self._pending.add(topic)
        self._pool.submit(self._load_one, topic)

    def _load_one(self, topic: str) -> None:
        try:
            exists = self._lookup(topic)
            self._known[topic] = (bool(exists), self._clock())
        except Exception as exc:  # noqa: BLE001 - a failed lookup is tried again on the next ask
            log.warning("could not look callback topic %r up: %s", topic, exc)
        finally:
            with self._mutex:
                self._pending.discard(topic)

    def _load_all(self) -> None:
        try:
            names = self._lookup(None)
        except Exception as exc:  # noqa: BLE001 - topics are then looked up one by one
            log.warning("could not list the cluster's topics: %s", exc)
            return
        now = self._clock()
        assert isinstance(names, set)  # noqa: S101 - lookup(None) lists
        for name in names:
            self._known.setdefault(name, (True, now))
