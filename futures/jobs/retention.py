"""Whether `timer-events` still holds the events a compaction needs.

A version is *fired* because a FIRED event names it. When that event has left
`timer-events` (deleted by retention, or removed by compacting the topic), the
version looks pending, and a snapshot of it would fire the timer again on
replay. Requests and events are separate topics, and nothing in Kafka keeps
their retentions in step, so compaction checks before it trusts the events.

Two kinds of evidence, both from metadata (no record is read but one per
partition):

* **deleted** — a partition of `timer-events` starts above the first offset the
  compaction needs (0, or the end of the base snapshot's events): those events
  are gone. The first remaining record's timestamp bounds when they were written.
* **may be deleted** — the topic's ``retention.ms`` is finite: events older than
  now minus it may be gone, or go while the job reads (the readers then fail,
  see :data:`~futures.jobs.offsets.CONSUMER_DEFAULTS`); ``cleanup.policy``
  ``compact`` keeps only the latest event per timer id, so any may be gone.

Either gives a *horizon*: events written up to then may be missing. A timer
never fires early, and the worker writes its FIRED event after firing, so an
event written after the horizon is never about a timer due after it: only the
pending timers due at or before the horizon can have fired unseen. Compaction
counts those (``unchecked``) once it has classified the log, and refuses when
there are any (:mod:`futures.jobs.compact`).

The embedded Tansu broker reports ``retention.ms`` and ``cleanup.policy`` set on
a topic but enforces neither, and never deletes records: there only the configuration path can be exercised.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from futures.jobs.offsets import OffsetPlanner

log = logging.getLogger(__name__)

#: Added to every horizon (ms): the clocks of the broker, the workers and this job
#: differ, and retention goes on deleting while the job runs.
CLOCK_MARGIN_MS = 5 * 60 * 1000


@dataclass(frozen=True)
class EventLoss:
    """Events written up to ``horizon_ms`` (epoch ms) may be missing, for ``reasons``."""

    horizon_ms: int
    reasons: tuple[str, ...]


class EventsLog(Protocol):
    """What the check asks Kafka (a fake in unit tests)."""

    def topic_config(self, topic: str) -> Mapping[str, str] | None:
        """The topic's configuration; None when the broker will not say."""
        ...

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        """Timestamp (epoch ms) of the record at ``offset``; None when there is none."""
        ...


class KafkaEventsLog:
    """:class:`EventsLog` of a cluster: DescribeConfigs, and one fetch per partition asked."""

    def __init__(self, kafka: Mapping[str, Any], timeout_s: float = 15.0) -> None:
        self._kafka = dict(kafka)
        self._timeout_s = timeout_s

    def topic_config(self, topic: str) -> Mapping[str, str] | None:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        admin = AdminClient(self._kafka)
        try:
            entries = admin.describe_configs([resource], request_timeout=self._timeout_s)[resource].result()
        except KafkaException as exc:  # e.g. no DESCRIBE_CONFIGS permission
            log.warning("cannot read the configuration of %s: %s", topic, exc)
            return None
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        with OffsetPlanner(self._kafka, self._timeout_s) as planner:
            return planner.timestamp_at(topic, partition, offset)


def check_events(
    events: EventsLog,
    topic: str,
    marks: Mapping[int, tuple[int, int]],
    needed: Mapping[int, int],
    now_ms: int,
) -> EventLoss | None:
    """What may be missing from ``topic``; None when every event needed is there to stay.

    ``marks``: ``{partition: (low, high)}`` watermarks; ``needed``: the first offset
    the compaction needs per partition (absent: 0); ``now_ms``: epoch ms.
    """
    reasons: list[str] = []
    horizons: list[int] = []
    config = events.topic_config(topic)
    if config is None:
        log.warning(
            "the retention of %s is not checked (its configuration is unreadable); "
            "only records already deleted are",
            topic,
        )
    else:
        policy = {p.strip() for p in config.get("cleanup.policy", "delete").split(",")}
        retention = _int(config.get("retention.ms"))
        if "delete" in policy and retention is not None and retention >= 0:
            horizon = now_ms - retention + CLOCK_MARGIN_MS
            horizons.append(horizon)
            reasons.append(
                f"{topic} has retention.ms={retention} ({_span(retention)}): "
                f"its events written before {_iso(horizon)} may be deleted"
            )
        if "compact" in policy:
            horizons.append(now_ms + CLOCK_MARGIN_MS)
            reasons.append(
                f"{topic} is compacted (cleanup.policy={config['cleanup.policy']}): Kafka keeps the latest "
                "event per timer id only, so any FIRED event may be gone"
            )
    for partition, (low, high) in sorted(marks.items()):
        start = needed.get(partition, 0)
        if low <= start:
            continue
        first = events.timestamp_at(topic, partition, low) if high > low else None
        horizon = (now_ms if first is None else first) + CLOCK_MARGIN_MS
        horizons.append(horizon)
        reasons.append(
            f"{topic}[{partition}] records {start}..{low - 1} were deleted (the partition starts at "
            f"offset {low}), events written up to about {_iso(horizon)}"
        )
    if not reasons:
        return None
    return EventLoss(max(horizons), tuple(reasons))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _span(ms: int) -> str:
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000), ("second", 1000)):
        if ms >= size:
            n = ms / size
            return f"{n:g} {unit}" + ("" if n == 1 else "s")
    return f"{ms} ms"
