"""The check of `timer-events` before compaction trusts it, against a fake Kafka.

The low-watermark path (records deleted from `timer-events`) cannot happen on
the embedded Tansu broker, which never deletes a record (no retention, no
DeleteRecords): it is tested here only. The configuration path also runs on the
broker, in test_event_retention.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from pyspark.sql import SparkSession

from futures.jobs.compact import check_event_loss, count_unchecked, transform
from futures.jobs.config import JobConfig
from futures.jobs.errors import SnapshotError
from futures.jobs.retention import CLOCK_MARGIN_MS, EventLoss, check_events
from tests.jobs.crafted import T0, Events, Kind, Log

NOW = T0 + 30 * 86_400_000
TOPIC = "timer-events"
DAY = 86_400_000


@dataclass
class FakeEvents:
    """An :class:`~futures.jobs.retention.EventsLog` that answers from dicts."""

    config: Mapping[str, str] | None = field(default_factory=dict)
    timestamps: dict[tuple[int, int], int] = field(default_factory=dict)
    asked: list[tuple[int, int]] = field(default_factory=list)

    def topic_config(self, topic: str) -> Mapping[str, str] | None:
        assert topic == TOPIC
        return self.config

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        self.asked.append((partition, offset))
        return self.timestamps.get((partition, offset))


INTACT = {0: (0, 10), 1: (0, 0)}


def test_no_retention_and_nothing_deleted_is_no_loss() -> None:
    assert check_events(FakeEvents(), TOPIC, INTACT, {}, NOW) is None
    assert check_events(FakeEvents({"retention.ms": "-1"}), TOPIC, INTACT, {}, NOW) is None
    # Kafka's answer lists every setting; with cleanup.policy=delete only retention.ms matters.
    infinite = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    assert check_events(FakeEvents(infinite), TOPIC, INTACT, {}, NOW) is None


def test_a_finite_retention_puts_the_horizon_that_far_back() -> None:
    loss = check_events(FakeEvents({"retention.ms": str(7 * DAY)}), TOPIC, INTACT, {}, NOW)
    assert loss is not None
    assert loss.horizon_ms == NOW - 7 * DAY + CLOCK_MARGIN_MS
    assert loss.reasons == (
        f"{TOPIC} has retention.ms={7 * DAY} (7 days): its events written before 2026-12-11T11:11:40Z "
        "may be deleted",
    )


def test_a_compacted_events_topic_may_have_lost_any_event() -> None:
    loss = check_events(FakeEvents({"cleanup.policy": "compact"}), TOPIC, INTACT, {}, NOW)
    assert loss is not None and loss.horizon_ms == NOW + CLOCK_MARGIN_MS
    assert "cleanup.policy=compact" in loss.reasons[0]


def test_deleted_records_put_the_horizon_at_the_first_one_left() -> None:
    fake = FakeEvents(timestamps={(0, 40): NOW - 3 * DAY})
    loss = check_events(fake, TOPIC, {0: (40, 90), 1: (0, 5)}, {}, NOW)
    assert loss is not None
    assert loss.horizon_ms == NOW - 3 * DAY + CLOCK_MARGIN_MS
    assert fake.asked == [(0, 40)]
    assert loss.reasons[0].startswith(
        f"{TOPIC}[0] records 0..39 were deleted (the partition starts at offset 40)"
    )


def test_a_partition_deleted_to_its_end_may_have_lost_events_up_to_now() -> None:
    fake = FakeEvents()
    loss = check_events(fake, TOPIC, {0: (40, 40)}, {}, NOW)
    assert loss is not None and loss.horizon_ms == NOW + CLOCK_MARGIN_MS
    assert fake.asked == []  # nothing left to ask about


def test_records_deleted_below_what_the_base_snapshot_covers_are_not_needed() -> None:
    assert check_events(FakeEvents(), TOPIC, {0: (40, 90), 1: (7, 9)}, {0: 50, 1: 7}, NOW) is None
    loss = check_events(FakeEvents(), TOPIC, {0: (40, 90), 1: (7, 9)}, {0: 30, 1: 7}, NOW)
    assert loss is not None and [r.split(" were")[0] for r in loss.reasons] == [f"{TOPIC}[0] records 30..39"]


def test_the_latest_horizon_of_all_evidence_wins() -> None:
    fake = FakeEvents({"retention.ms": str(7 * DAY)}, {(1, 3): NOW - DAY})
    loss = check_events(fake, TOPIC, {0: (0, 9), 1: (3, 9)}, {}, NOW)
    assert loss is not None and len(loss.reasons) == 2
    assert loss.horizon_ms == NOW - DAY + CLOCK_MARGIN_MS


def test_an_unreadable_configuration_leaves_the_deleted_records_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="futures.jobs.retention"):
        assert check_events(FakeEvents(config=None), TOPIC, INTACT, {}, NOW) is None
    assert "the retention of timer-events is not checked" in caplog.text
    assert check_events(FakeEvents(config=None), TOPIC, {0: (2, 2)}, {}, NOW) is not None


# -- what compaction does with a horizon ----------------------------------------


def test_only_pending_timers_due_by_the_horizon_are_unchecked(spark: SparkSession) -> None:
    """A timer never fires early: one due after the horizon cannot have a deleted FIRED event."""
    log, events = Log(), Events()
    log.schedule(0, "pending-due-early", T0)
    o = log.schedule(1, "fired-due-early", T0)
    events.add(Kind.FIRED, 1, "fired-due-early", o, T0)
    log.schedule(2, "pending-due-late", T0 + DAY)
    classified = transform(log.df(spark), events.df(spark), JobConfig().parse_limits()).classified
    assert count_unchecked(classified, None) == 0
    assert count_unchecked(classified, EventLoss(T0 + 1000, ("r",))) == 1
    assert count_unchecked(classified, EventLoss(T0 + DAY, ("r",))) == 2


def test_a_possible_loss_is_refused_only_when_a_pending_timer_is_concerned() -> None:
    loss = EventLoss(NOW, ("timer-events has retention.ms=1000 (1 second): ...",))
    check_event_loss(None, 0, accept=False)
    check_event_loss(loss, 0, accept=False)
    check_event_loss(loss, 3, accept=True)
    with pytest.raises(
        SnapshotError, match=r"retention\.ms=1000.*3 pending timers due before.*--accept-event-loss"
    ):
        check_event_loss(loss, 3, accept=False)
