"""What the worker needs of its changelog topic, read at start: it refuses one that deletes
records, and reuses a table only while the tombstones written since it was current are kept."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futures.worker.changelog_topic import (
    COMPACTION_LAG_MS,
    KAFKA_DELETE_RETENTION_MS,
    TableReuse,
    check_changelog,
)
from ktimers.errors import TopicLayoutError

TOPIC = "timers-timers-changelog"
HOUR_MS = 3_600_000
NOW_MS = 1_800_000_000_000


class FakeTopics:
    def __init__(self, config: Mapping[str, str] | None, exists: bool = True) -> None:
        self._config, self._exists = config, exists

    def exists(self, topic: str) -> bool:
        return self._exists

    def config(self, topic: str) -> Mapping[str, str] | None:
        return self._config


def _kafka(**settings: str) -> dict[str, str]:
    """A topic's settings as Kafka reports them: every one, defaults included."""
    reported = {"cleanup.policy": "compact", "delete.retention.ms": "86400000", "retention.ms": "604800000"}
    reported.update({name.replace("_", "."): value for name, value in settings.items()})
    return reported


def test_a_table_is_reused_within_the_tombstones_retention_less_an_hour() -> None:
    reuse = check_changelog(TOPIC, FakeTopics(_kafka()))
    assert str(reuse) == (
        f"changelog {TOPIC}: cleanup.policy=compact, delete.retention.ms=86400000 (24 h): a table is "
        "reused if current within 23 h, else rebuilt from the changelog"
    )
    assert reuse == TableReuse(23 * HOUR_MS)
    assert reuse.reusable(NOW_MS - 22 * HOUR_MS, NOW_MS)
    assert not reuse.reusable(NOW_MS - 23 * HOUR_MS, NOW_MS)
    assert not reuse.reusable(None, NOW_MS)


def test_a_longer_retention_reuses_older_tables_and_a_short_one_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert check_changelog(
        TOPIC, FakeTopics(_kafka(delete_retention_ms=str(7 * 24 * HOUR_MS)))
    ) == TableReuse((7 * 24 - 1) * HOUR_MS)
    with caplog.at_level(logging.WARNING):
        short = check_changelog(TOPIC, FakeTopics(_kafka(delete_retention_ms="600000")))
    assert short == TableReuse(300_000)  # half of it: the margin is at most half
    assert "delete.retention.ms=600000" in caplog.text


def test_a_compaction_lag_under_15_minutes_is_warned_about_with_the_command_that_raises_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        check_changelog(TOPIC, FakeTopics(_kafka(min_compaction_lag_ms=str(COMPACTION_LAG_MS))))
    assert "min.compaction.lag.ms" not in caplog.text
    with caplog.at_level(logging.WARNING):
        check_changelog(TOPIC, FakeTopics(_kafka(min_compaction_lag_ms="0")))
    assert f"--add-config min.compaction.lag.ms={COMPACTION_LAG_MS}" in caplog.text


@pytest.mark.parametrize(
    "settings",
    [
        {"cleanup_policy": "delete"},
        {"cleanup_policy": "compact,delete"},
        {"cleanup_policy": "delete,compact", "retention_ms": "86400000"},
    ],
)
def test_a_changelog_that_deletes_records_is_refused_with_the_command_that_fixes_it(
    settings: dict[str, str],
) -> None:
    with pytest.raises(TopicLayoutError, match="--add-config cleanup.policy=compact"):
        check_changelog(TOPIC, FakeTopics(_kafka(**settings)))


def test_compact_and_delete_without_a_retention_keeps_every_record() -> None:
    assert check_changelog(TOPIC, FakeTopics(_kafka(cleanup_policy="compact,delete", retention_ms="-1"))) == (
        TableReuse.after(KAFKA_DELETE_RETENTION_MS)
    )


def test_the_embedded_brokers_partial_settings_start_the_worker_with_kafkas_defaults() -> None:
    # It reports what the topic was created with, and nothing for a default.
    assert check_changelog(TOPIC, FakeTopics({"cleanup.policy": "compact"})) == TableReuse(23 * HOUR_MS)
    assert check_changelog(TOPIC, FakeTopics({})) == TableReuse(23 * HOUR_MS)


def test_unreadable_settings_or_a_changelog_not_created_yet_reuse_no_table(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        unreadable = check_changelog(TOPIC, FakeTopics(None))
    assert "DescribeConfigs" in caplog.text and "every table found in the data dir is rebuilt" in caplog.text
    missing = check_changelog(TOPIC, FakeTopics(_kafka(), exists=False))
    assert not unreadable.reusable(NOW_MS, NOW_MS) and not missing.reusable(NOW_MS, NOW_MS)


SETTINGS = st.sampled_from(["cleanup.policy", "delete.retention.ms", "retention.ms", "x"])


@given(st.dictionaries(SETTINGS, st.text()))
def test_any_settings_give_a_reuse_window_or_a_clear_refusal(config: dict[str, str]) -> None:
    try:
        reuse = check_changelog(TOPIC, FakeTopics(config))
    except TopicLayoutError as exc:
        assert "cleanup.policy" in str(exc)
    else:
        assert 0 <= reuse.max_age_ms and str(reuse).startswith(f"changelog {TOPIC}: ")
