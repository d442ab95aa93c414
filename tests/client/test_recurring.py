"""Recurring timers from the client: cron with a zone, intervals, until and max_count, checked here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from futures.client import build_schedule
from ktimers.config import CommonConfig
from ktimers.wire import Future

NOW = datetime(2024, 3, 30, 12, 0, 10, tzinfo=UTC).timestamp()  # a Saturday, the day before Paris's DST


def schedule(**options: object) -> Future:
    record, handle = build_schedule(CommonConfig(), "reminders", "k", b"v", now=NOW, **options)  # type: ignore[arg-type]
    future = Future.FromString(record.value)
    assert handle.due_ms == future.due_ms
    return future


def test_a_cron_series_starts_at_its_next_local_match() -> None:
    future = schedule(cron="0 9 * * *", tz="Europe/Paris")
    # 09:00 in Paris on Sunday 31 March 2024 is 07:00 UTC: summer time began that night.
    assert future.due_ms == datetime(2024, 3, 31, 7, tzinfo=UTC).timestamp() * 1000
    assert (future.recurrence.cron, future.recurrence.time_zone) == ("0 9 * * *", "Europe/Paris")


def test_a_cron_series_with_at_starts_at_its_first_match_from_then() -> None:
    at = datetime(2024, 4, 2, 9, 0, tzinfo=UTC)
    assert schedule(cron="0 9 * * *", at=at).due_ms == at.timestamp() * 1000


def test_an_interval_series_starts_one_interval_from_now_or_at_the_given_time() -> None:
    future = schedule(every=timedelta(seconds=30), max_count=5, until=NOW + 3600)
    assert future.due_ms == round((NOW + 30) * 1000)
    assert (future.recurrence.interval_ms, future.recurrence.max_count) == (30_000, 5)
    assert future.recurrence.until_ms == round((NOW + 3600) * 1000)
    assert schedule(every=60, delay=0).due_ms == round(NOW * 1000)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"cron": "0 9 * *"}, "has 4 fields"),
        ({"cron": "0 9 * * *", "tz": "Europe/Atlantis"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "every": 60}, "exactly one of cron="),
        ({"every": 0.5}, "shortest interval"),
        ({"every": float("nan")}, "give seconds"),
        ({"every": 60, "tz": "Europe/Paris"}, "tz= is the time zone of cron="),
        ({"every": 60, "max_count": 0}, "max_count=0"),
        ({"every": 60, "until": NOW}, "before the first due time"),
        ({"tz": "UTC"}, "exactly one of cron="),
    ],
)
def test_a_bad_recurrence_is_a_value_error_at_the_call(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        schedule(**options)
