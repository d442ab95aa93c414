"""What a request must satisfy to become a timer: the parse limits, one frozen object.

The worker builds them from its config (:attr:`futures.worker.config.WorkerConfig.parse_limits`);
the Spark jobs build permissive ones (:meth:`ParseLimits.permissive`) to read a log
whose records the worker already judged. Parsing needs nothing else.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from futures.ingress.registry import SchemaCheck
from ktimers.config import DEFAULT_APP_ID, TopicsConfig

# Kafka's own rule for topic names.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")

#: A ``max_payload_bytes`` this large limits nothing: no Kafka record comes near 1 TiB.
NO_PAYLOAD_LIMIT = 1 << 40

#: Callback topics refused unless ``TIMERS_DENIED_CALLBACK_TOPICS`` says otherwise:
#: internal topics of Kafka Streams, Faust, Connect and Schema Registry, which a timer
#: must not be able to write into. (``__*``, the service's own topics and
#: ``<app-id>-*`` are always refused.)
DEFAULT_DENIED_CALLBACK_TOPICS = ("_schemas", "connect-*", "*-changelog", "*-repartition")


@dataclass(frozen=True)
class ParseLimits:
    """The topics requests arrive on, and the limits every timer passes (README, "Configuration")."""

    topics: TopicsConfig = field(default_factory=TopicsConfig)
    #: ``TIMERS_APP_ID``: callback topics ``<app-id>-*`` are the worker's own, always refused.
    app_id: str = DEFAULT_APP_ID
    #: fnmatch patterns of allowed callback topics; empty allows any topic
    #: except the service's own, ``__*`` internals and ``denied_callback_topics``.
    allowed_callback_topics: tuple[str, ...] = ()
    #: fnmatch patterns of refused callback topics (see DEFAULT_DENIED_CALLBACK_TOPICS).
    denied_callback_topics: tuple[str, ...] = DEFAULT_DENIED_CALLBACK_TOPICS
    #: (request topic, fnmatch patterns) of the request topics that have their own list of
    #: callback topics; it replaces ``allowed_callback_topics`` for their records.
    own_callback_topics: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Checks the schema id of framed requests against a Schema Registry; None trusts the message index.
    schemas: SchemaCheck | None = None
    #: Largest timer accepted, as stored: its serialized ``StoredTimer`` plus table
    #: key (bytes). Larger requests are dead-lettered ``payload-too-large`` at ingest.
    max_payload_bytes: int = 1_000_000
    #: Reject timers due further ahead than this (seconds); 0 = no limit.
    max_due_ahead_s: float = 0.0

    @classmethod
    def permissive(cls, topics: TopicsConfig, app_id: str = DEFAULT_APP_ID) -> ParseLimits:
        """The service's topics and none of the worker's size or horizon limits.

        For reading a request log after the fact: whether the worker accepted a
        record under the limits it had then is what `timer-events` says, not
        something to re-judge with today's settings.
        """
        return cls(topics=topics, app_id=app_id, max_payload_bytes=NO_PAYLOAD_LIMIT)

    def callback_topic_problem(self, topic: str, request_topic: str | None = None) -> tuple[str, str] | None:
        """Why ``topic`` cannot receive callbacks of a record of ``request_topic``: (reason, detail), or None.

        ``request_topic`` None: the checks common to every request topic, and ``allowed_callback_topics``.
        """
        if not topic:
            return "missing-callback-topic", "callBackTopic is empty"
        if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            return "invalid-callback-topic", f"{topic!r} is not a valid Kafka topic name"
        # The service's own topics and Kafka/Faust internals are never targets:
        # a timer must not be able to forge ticks, requests or table state.
        if topic in self.topics.own or topic.startswith("__") or topic.startswith(f"{self.app_id}-"):
            return "callback-topic-not-allowed", f"{topic!r} is an internal topic"
        denied = next((p for p in self.denied_callback_topics if fnmatch.fnmatchcase(topic, p)), None)
        if denied is not None:
            return (
                "callback-topic-not-allowed",
                f"{topic!r} matches {denied!r} of TIMERS_DENIED_CALLBACK_TOPICS (internal topics of "
                "Kafka platforms are refused unless that variable says otherwise)",
            )
        own = self.own_callback_topics_of(request_topic) if request_topic is not None else None
        allowed = self.allowed_callback_topics if own is None else own
        if not allowed or any(fnmatch.fnmatchcase(topic, pattern) for pattern in allowed):
            return None
        if own is not None:
            setting = (
                "TIMERS_REQUEST_ALLOWED_CALLBACK_TOPICS"
                if request_topic == self.topics.request
                else "TIMERS_INGRESS_TOPICS"
            )
            where = f"its own list {','.join(own)} ({setting})"
        else:
            where = f"TIMERS_ALLOWED_CALLBACK_TOPICS={','.join(allowed)}"
        if request_topic is None:
            return "callback-topic-not-allowed", f"{topic!r} is not in {where}"
        return (
            "callback-topic-not-allowed",
            f"{topic!r} is not allowed for request topic {request_topic!r}: not in {where}",
        )

    def own_callback_topics_of(self, request_topic: str) -> tuple[str, ...] | None:
        """The callback-topic patterns ``request_topic`` has of its own, or None: it has none."""
        return next((p for t, p in self.own_callback_topics if t == request_topic), None)
