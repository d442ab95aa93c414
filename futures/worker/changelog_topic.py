"""What the worker needs of its changelog topic, read at start, and how old a table may be to be reused.

The changelog (``<app-id>-timers-changelog``, created by Faust) is the table's replica; a
table in the data dir is a cache of it. Restoring is exact from whatever Kafka holds, as long as:

* **``cleanup.policy=compact``, without ``delete``**: compaction keeps each key's latest record,
  which is all a restore needs; deletion by ``retention.ms`` would drop the puts of timers
  pending longer than it, and a restore would lose them. The worker refuses to start otherwise.
* **a table is caught up only while the tombstones written since it was current are still in
  the changelog.** Kafka keeps a tombstone at least ``delete.retention.ms`` (24 h by default)
  after it was written. A table current at time c (every progress record it writes marks it,
  :attr:`~futures.worker.table.PartitionTimers.current_ms`) misses only records written after c,
  their tombstones among them, each kept until c + ``delete.retention.ms`` at least: the table
  is reused while younger than that, less a margin (:class:`TableReuse`) for clocks that differ
  and the catch-up's own time; older, it is deleted and rebuilt from offset 0. The same bound
  holds for a rebuild from offset 0: it must end within ``delete.retention.ms`` of its start, or
  a put read before its tombstone was cleaned comes back (Kafka's own rule for a consumer
  reading a compacted topic from its start). A value under an hour is warned about.
* **``min.compaction.lag.ms`` of at least** :data:`COMPACTION_LAG_MS` (15 min; Faust creates
  the changelog with it): a revoked owner's late record may be the latest of a key its successor
  wrote too, and the successor writes that key again within seconds
  (:mod:`futures.worker.restate`); until it has, the lag keeps the record it writes again from
  compaction. A shorter lag is warned about. Otherwise compaction removes only a record a later
  one of its key supersedes, so a catch-up from any offset reads each key's latest record since,
  and the table's state is the log's. An ``f`` record compacted away (its tombstone, or a
  record of another owner under the same key, superseded it) deletes nothing on the catch-up,
  but each timer it listed has a tombstone of its own before the record's
  (:mod:`futures.worker.sweep`). ``max.compaction.lag.ms`` and ``segment.ms`` may be anything.

A broker that does not answer (no DescribeConfigs permission) leaves the retention unknown: the
worker starts, and rebuilds every table it finds. A changelog that does not exist yet (Faust
creates it) makes every table found a cache of a log that is gone: rebuilt too. In both cases the
worker reads the settings again after each rebalance, until it can, for the tables it keeps
through the next (:attr:`TableReuse.settled`). The embedded
broker reports only the settings a topic was created with, and never compacts or expires anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from ktimers.config import KafkaConfig
from ktimers.errors import TopicLayoutError
from ktimers.topics import partition_counts

log = logging.getLogger(__name__)

#: Kafka's default ``delete.retention.ms`` (``log.cleaner.delete.retention.ms``): 24 h.
KAFKA_DELETE_RETENTION_MS = 24 * 60 * 60 * 1000
#: Taken off ``delete.retention.ms`` before a table is deemed too old (ms; at most half of it):
#: for the clocks of this host, the table's last owner and the broker, and the catch-up's own time.
REUSE_MARGIN_MS = 60 * 60 * 1000
#: A ``delete.retention.ms`` below this is warned about: a rebuild from offset 0 must end within it.
SHORT_RETENTION_MS = 60 * 60 * 1000
#: The ``min.compaction.lag.ms`` the changelog is created with, and below which it is warned about:
#: how long a record stays uncompacted, time enough for a key a revoked owner wrote late to be
#: written again (:mod:`futures.worker.restate`) even across the failover of its new owner.
COMPACTION_LAG_MS = 15 * 60 * 1000


@dataclass(frozen=True)
class TableReuse:
    """How long after it was last current a table found in the data dir (or kept through a
    rebalance) can still be caught up exactly from the changelog."""

    #: Reused while younger than this (ms); 0: never reused.
    max_age_ms: int
    #: What it was decided from, for the worker's log.
    reason: str = field(default="", compare=False)
    #: Read from the changelog's settings. Else (not created yet, unreadable) every table found at
    #: start is rebuilt, and the worker reads them again after each rebalance until it can.
    settled: bool = field(default=True, compare=False)

    @classmethod
    def after(cls, delete_retention_ms: int, reason: str = "") -> TableReuse:
        """Reuse within ``delete_retention_ms`` (the changelog's, ms) less the margin."""
        margin = min(REUSE_MARGIN_MS, delete_retention_ms // 2)
        return cls(max(delete_retention_ms - margin, 0), reason)

    def __str__(self) -> str:
        if not self.max_age_ms:
            return f"{self.reason}: every table found in the data dir is rebuilt from the changelog"
        return (
            f"{self.reason}: a table is reused if current within {_span(self.max_age_ms)}, "
            "else rebuilt from the changelog"
        )

    def reusable(self, current_ms: int | None, now_ms: int) -> bool:
        """Whether a table last current at ``current_ms`` (None: never known) is caught up exactly
        at ``now_ms`` (wall-clock epoch ms both)."""
        return current_ms is not None and now_ms - current_ms < self.max_age_ms


#: What tables are reused with when the worker has not read the changelog's settings (tests).
DEFAULT_REUSE = TableReuse.after(KAFKA_DELETE_RETENTION_MS, "Kafka's default delete.retention.ms")


class TopicConfigs(Protocol):
    """What the check asks Kafka (a fake in unit tests)."""

    def exists(self, topic: str) -> bool: ...

    def config(self, topic: str) -> Mapping[str, str] | None:
        """The topic's settings the broker reports; None when it will not say."""
        ...


class KafkaTopicConfigs:
    """:class:`TopicConfigs` of a cluster: its metadata and DescribeConfigs."""

    def __init__(self, admin: AdminClient, kafka: KafkaConfig, timeout_s: float = 10.0) -> None:
        self._admin = admin
        self._kafka = kafka
        self._timeout_s = timeout_s

    def exists(self, topic: str) -> bool:
        # The listing of every topic: asking for one by name creates it where brokers create
        # topics on first use.
        return topic in partition_counts(self._admin, [topic], self._kafka, self._timeout_s)

    def config(self, topic: str) -> Mapping[str, str] | None:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            entries = self._admin.describe_configs([resource], request_timeout=self._timeout_s)[
                resource
            ].result()
        except KafkaException as exc:  # e.g. no DESCRIBE_CONFIGS permission
            log.warning("cannot read the configuration of %s: %s", topic, exc)
            return None
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def check_changelog(topic: str, topics: TopicConfigs) -> TableReuse:
    """Check ``topic`` keeps what a restore needs, and say how old a table may be to be reused
    (its ``str`` is the line the worker logs once its logging is set up). Warns of what an operator
    should change; raises :class:`TopicLayoutError` for a changelog that deletes records."""
    if not topics.exists(topic):
        return TableReuse(0, f"changelog {topic}: not created yet", settled=False)
    config = topics.config(topic)
    if config is None:
        return _warned(f"changelog {topic}: settings unreadable (grant DescribeConfigs on it)")
    policy = config.get("cleanup.policy")
    if policy is not None:
        _refuse_deletion(topic, policy, config.get("retention.ms"))
    raw = config.get("delete.retention.ms")
    retention = _int(raw)
    if raw is not None and retention is None:
        return _warned(f"changelog {topic}: delete.retention.ms={raw!r} is not a number")
    said = "" if retention is not None else ", Kafka's default"
    retention = KAFKA_DELETE_RETENTION_MS if retention is None else retention
    reason = (
        f"changelog {topic}: cleanup.policy={policy or '(not reported)'}, "
        f"delete.retention.ms={retention} ({_span(retention)}{said})"
    )
    if retention < SHORT_RETENTION_MS:
        log.warning(
            "changelog %s: delete.retention.ms=%d is under %s: a table rebuilt from the changelog must be "
            "read whole within it, or fired and cancelled timers may come back. Raise it: kafka-configs "
            "--alter --entity-type topics --entity-name %s --add-config delete.retention.ms=%d",
            topic, retention, _span(SHORT_RETENTION_MS), topic, KAFKA_DELETE_RETENTION_MS,
        )  # fmt: skip
    _check_lag(topic, config.get("min.compaction.lag.ms"))
    return TableReuse.after(retention, reason)


def _check_lag(topic: str, raw: str | None) -> None:
    lag = _int(raw)
    if lag is None or lag < COMPACTION_LAG_MS:
        log.warning(
            "changelog %s: min.compaction.lag.ms=%s is under %s: a key a revoked worker wrote late may "
            "be compacted over before its new owner writes it again, and a restore then misses it. "
            "Raise it: kafka-configs --alter --entity-type topics --entity-name %s --add-config "
            "min.compaction.lag.ms=%d",
            topic, raw or "0 (Kafka's default)", _span(COMPACTION_LAG_MS), topic, COMPACTION_LAG_MS,
        )  # fmt: skip


def _warned(reason: str) -> TableReuse:
    reuse = TableReuse(0, reason, settled=False)
    log.warning("%s", reuse)
    return reuse


def _refuse_deletion(topic: str, policy: str, retention_ms: str | None) -> None:
    flags = {flag.strip() for flag in policy.split(",")}
    retention = _int(retention_ms)
    deletes = "delete" in flags and not (retention is not None and retention < 0)
    if "compact" in flags and not deletes:
        return
    why = (
        "is not compacted" if "compact" not in flags else f"deletes records after retention.ms={retention_ms}"
    )
    raise TopicLayoutError(
        f"changelog {topic} has cleanup.policy={policy} and {why}: a table restored from it would lose the "
        f"timers pending longer than that. Set: kafka-configs --alter --entity-type topics --entity-name "
        f"{topic} --add-config cleanup.policy=compact"
    )


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _span(ms: int) -> str:
    hours = ms / 3_600_000
    return f"{hours:g} h" if hours >= 1 else f"{ms / 60_000:g} min"
