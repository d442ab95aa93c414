"""Which callback topics exist, learnt in the background so that firing never waits for it.

librdkafka holds a record for a topic it has no metadata for until the topic
appears or ``message.timeout.ms`` passes; the engine's flush waits for every
record of a piece, under the engine lock. One timer addressed to a topic that
does not exist would stall firing for every partition for up to 30 s, every
tick. So the engine asks :class:`CallbackTopics` first; it answers from memory:

* a topic seen in the cluster's metadata: produce;
* a topic never looked up: not now — a background lookup starts, and the
  timer stays in the table for the next tick (one tick late at most);
* a topic the lookup did not find: the timer is dead-lettered
  (``callback-undeliverable``), so the user can create the topic and resend it.

A lookup never creates a topic. Metadata asked for one topic by name creates it
on a broker that creates topics on first use (Kafka's default
``auto.create.topics.enable=true``, and the embedded broker): librdkafka's
``allow.auto.create.topics`` is true for a producer. A request could then make the
worker create any topic its allow-list admits. So the lookup lists every topic of
the cluster, which creates none, and one listing answers every topic asked about
since the previous one and refreshes every topic remembered. Listings run one at a
time, spaced to take at most :data:`LISTING_SHARE` of the time (a listing of thousands of
topics takes a small part of a tick, so a topic asked about is still answered within one:
docs/PERFORMANCE.md#firing-a-timer).
Answers are refreshed every ``refresh_s``: topics created or deleted later are seen.

Memory does not grow with the names requests carry: at most :data:`MAX_TOPICS`
answers are remembered, the least recently asked forgotten first (a throttled log
line says so), and at most as many topics wait for a listing. A forgotten topic is
looked up again when it is next asked about, one tick late, as a topic never seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

from confluent_kafka import KafkaError, Producer

from ktimers.logs import ThrottledLog

log = logging.getLogger(__name__)

#: Most callback topics remembered, and most waiting for a lookup. Far more than a service
#: has callback topics, in a few megabytes (docs/PERFORMANCE.md#firing-a-timer), and more than
#: fire in one tick: an answer forgotten before its timers fire would make them wait for another
#: lookup.
MAX_TOPICS = 10_000
#: Share of the time listings may take: after one that took d s, the next waits 9 d.
LISTING_SHARE = 0.1
#: Wait before listing again after a listing failed (s).
RETRY_S = 1.0

#: Lists the cluster's topics: every topic's name → whether its metadata came without error.
Listing = Callable[[], Mapping[str, bool]]


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
        listing: Listing,
        *,
        refresh_s: float = 30.0,
        max_topics: int = MAX_TOPICS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._listing = listing
        self._refresh_s = refresh_s
        self._max_topics = max_topics
        self._clock = clock
        # Guards what follows; the fire path asks under it (once per topic and tick, not per timer).
        self._changed = threading.Condition(threading.Lock())
        # topic → (exists, when it was listed), the least recently asked first.
        self._known: OrderedDict[str, tuple[bool, float]] = OrderedDict()
        self._asked: set[str] = set()  # waiting for the next listing
        self._closed = False
        #: Answers forgotten so far to stay within ``max_topics``.
        self.forgotten = 0
        # A flood of new names: a line a minute each, not one per topic.
        self._forget_log = ThrottledLog(log, burst=1, interval_s=60.0)
        self._wait_log = ThrottledLog(log, burst=1, interval_s=60.0)
        self._thread = threading.Thread(target=self._run, name="callback-topics", daemon=True)
        self._thread.start()

    @classmethod
    def of_producer(
        cls, producer: Producer, timeout_s: float = 10.0, refresh_s: float = 30.0
    ) -> CallbackTopics:
        """Listed through a confluent-kafka producer's metadata: all topics, never one by name."""

        def listing() -> dict[str, bool]:
            metadata = producer.list_topics(timeout=timeout_s)
            return {name: meta.error is None for name, meta in metadata.topics.items()}

        return cls(listing, refresh_s=refresh_s)

    @property
    def remembered(self) -> int:
        """How many topics' answers are in memory (at most ``max_topics``)."""
        with self._changed:
            return len(self._known)

    @property
    def waiting(self) -> int:
        """How many topics wait for the next listing (at most ``max_topics``)."""
        with self._changed:
            return len(self._asked)

    def problem(self, topic: str) -> KafkaError | None:
        with self._changed:
            known = self._known.get(topic)
            if known is None:
                self._ask(topic)
                return _looking_up(topic)
            self._known.move_to_end(topic)
            exists, when = known
            fresh = self._clock() - when < self._refresh_s
            if not fresh:
                self._ask(topic)
        if exists:
            return None  # meanwhile, as it was: topics are rarely deleted
        if fresh:
            return KafkaError(
                KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {topic!r} does not exist in the cluster"
            )
        return _looking_up(topic)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _ask(self, topic: str) -> None:
        """Under the lock: ``topic`` is answered by the next listing."""
        if topic in self._asked:
            return
        if len(self._asked) >= self._max_topics:  # asked about again on a later tick
            self._wait_log.warning("%d callback topics wait for a lookup, the most kept", len(self._asked))
            return
        self._asked.add(topic)
        self._changed.notify()

    def _run(self) -> None:
        """The lookup thread: a listing at start, then one whenever topics were asked about."""
        self._list(preload=True)
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked or self._closed)
                if self._closed:
                    return
            self._list(preload=False)

    def _list(self, *, preload: bool) -> None:
        """One listing, then the pause that keeps listings to their share of the time."""
        with self._changed:
            # Answered by a listing that starts after they were asked: a topic created
            # just before its timer fired is never dead-lettered on older news.
            asked = set(self._asked)
        started, listed_at = time.monotonic(), self._clock()
        try:
            topics = self._listing()
        except Exception as exc:  # noqa: BLE001 - asked topics wait for the next listing
            log.warning("could not list the cluster's topics: %s", exc)
            pause = RETRY_S
        else:
            self._learn(topics, asked, listed_at, preload=preload)
            pause = (time.monotonic() - started) * (1 / LISTING_SHARE - 1)
        with self._changed:
            self._changed.wait_for(lambda: self._closed, timeout=pause)

    def _learn(self, topics: Mapping[str, bool], asked: set[str], when: float, *, preload: bool) -> None:
        """Answers from a listing taken at ``when``. A topic whose metadata came with an error
        (no leader yet, say) keeps its old answer, or stays asked: it is neither here nor missing."""
        with self._changed:
            known = self._known
            for topic in list(known):
                healthy = topics.get(topic)
                if healthy is not False:
                    known[topic] = (healthy is not None, when)
            if preload:  # the least recently asked, before anything asked meanwhile
                for topic, healthy in topics.items():
                    if len(known) >= self._max_topics:
                        break
                    if healthy:
                        known.setdefault(topic, (True, when))
            for topic in asked:
                healthy = topics.get(topic)
                if healthy is not False:
                    self._asked.discard(topic)
                    self._remember(topic, healthy is not None, when)

    def _remember(self, topic: str, exists: bool, when: float) -> None:
        known = self._known
        if topic not in known and len(known) >= self._max_topics:
            forgotten, _ = known.popitem(last=False)
            self.forgotten += 1
            self._forget_log.warning(
                "%d callback topics remembered, the most kept: forgot %r; it is looked up again "
                "when next asked about, a tick late (%d forgotten so far)",
                len(known),
                forgotten,
                self.forgotten,
            )
        known[topic] = (exists, when)
        known.move_to_end(topic)


def _looking_up(topic: str) -> KafkaError:
    return KafkaError(
        KafkaError._UNKNOWN_TOPIC, f"looking topic {topic!r} up; trying again next tick", retriable=True
    )
