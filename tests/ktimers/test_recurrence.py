"""Recurring schedules: cron parsing, DST gaps and folds, intervals, until and max_count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ktimers.recurrence import (
    CronSchedule,
    RecurrenceError,
    next_occurrence,
    series_of,
)
from ktimers.timers_pb2 import Future, Recurrence

PARIS = "Europe/Paris"
NEW_YORK = "America/New_York"


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, zone: str = "UTC") -> int:
    """Epoch ms of a wall-clock time in ``zone`` (its first instant when repeated)."""
    return int(datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone)).timestamp() * 1000)


def utc(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC)


def dues(cron: str, zone: str, start_ms: int, count: int) -> list[datetime]:
    series = series_of(Recurrence(cron=cron, time_zone=zone), start_ms)
    found, at = [], start_ms
    for _ in range(count):
        nxt = series.next_after(at, at)
        assert nxt is not None
        found.append(utc(nxt))
        at = nxt
    return found


def test_a_daily_cron_follows_local_time_across_a_dst_change() -> None:
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    got = dues("0 9 * * *", PARIS, ms(2024, 3, 30, 12), 2)
    assert got == [datetime(2024, 3, 31, 7, tzinfo=UTC), datetime(2024, 4, 1, 7, tzinfo=UTC)]


@pytest.mark.parametrize(
    ("zone", "day", "gap_end_utc"),
    [
        # Paris springs forward at 02:00 CET to 03:00 CEST (01:00 UTC).
        (PARIS, (2024, 3, 31), datetime(2024, 3, 31, 1, tzinfo=UTC)),
        # New York springs forward at 02:00 EST to 03:00 EDT (07:00 UTC).
        (NEW_YORK, (2024, 3, 10), datetime(2024, 3, 10, 7, tzinfo=UTC)),
    ],
)
def test_a_local_time_skipped_by_spring_forward_fires_once_when_the_gap_ends(
    zone: str, day: tuple[int, int, int], gap_end_utc: datetime
) -> None:
    start = ms(*day, 0, 0, zone=zone)
    # 02:30 does not exist that day: it fires at 03:00, the first instant after the gap.
    assert dues("30 2 * * *", zone, start, 1) == [gap_end_utc]
    # Four local times inside the gap, and 03:00 itself: one fire for all of them.
    got = dues("0,15,30,45 2 * * *", zone, start, 2)
    assert got[0] == gap_end_utc
    assert got[1] - got[0] > timedelta(hours=20)  # the next is the following day's 02:00
    got = dues("0,30 2,3 * * *", zone, start, 2)
    assert got == [gap_end_utc, gap_end_utc + timedelta(minutes=30)]


@pytest.mark.parametrize(
    ("zone", "day", "first_utc"),
    [
        # Paris falls back at 03:00 CEST to 02:00 CET: 02:00-02:59 happen twice.
        (PARIS, (2024, 10, 27), datetime(2024, 10, 27, 0, 30, tzinfo=UTC)),
        # New York falls back at 02:00 EDT to 01:00 EST: 01:00-01:59 happen twice.
        (NEW_YORK, (2024, 11, 3), datetime(2024, 11, 3, 5, 30, tzinfo=UTC)),
    ],
)
def test_a_local_time_repeated_by_fall_back_fires_once_the_first_time(
    zone: str, day: tuple[int, int, int], first_utc: datetime
) -> None:
    hour = 2 if zone == PARIS else 1
    start = ms(*day, 0, 0, zone=zone)
    got = dues(f"30 {hour} * * *", zone, start, 2)
    assert got[0] == first_utc
    assert got[1] - got[0] == timedelta(hours=25)  # not an hour later: the repeat does not fire
    # Every 20 minutes through the repeated hour: each local time once.
    got = dues(f"*/20 {hour} * * *", zone, start, 4)
    assert got[:3] == [first_utc - timedelta(minutes=30) + timedelta(minutes=m) for m in (0, 20, 40)]
    assert got[3] - got[2] > timedelta(hours=20)


def test_starting_inside_the_repeated_hour_never_fires_its_second_pass() -> None:
    # 02:10 CET on 27 October 2024 is the second pass (01:10 UTC).
    second_pass = ms(2024, 10, 27, 1, 10)
    assert dues("*/20 2 * * *", PARIS, second_pass, 1) == [datetime(2024, 10, 28, 1, tzinfo=UTC)]


def test_day_fields_match_either_when_both_are_restricted_and_both_otherwise() -> None:
    start = ms(2024, 1, 1)  # a Monday
    # The 15th, or any Friday.
    got = dues("0 0 15 * 5", "UTC", start, 3)
    assert got == [datetime(2024, 1, d, tzinfo=UTC) for d in (5, 12, 15)]
    # Fridays in odd days of the month (a * field means "and").
    got = dues("0 0 */2 * 5", "UTC", start, 2)
    assert got == [datetime(2024, 1, 5, tzinfo=UTC), datetime(2024, 1, 19, tzinfo=UTC)]


def test_names_ranges_steps_and_macros() -> None:
    start = ms(2024, 1, 1)
    assert dues("0 12 * jan-feb mon-fri", "UTC", start, 1) == [datetime(2024, 1, 1, 12, tzinfo=UTC)]
    assert dues("5/20 * * * *", "UTC", start, 3)[2] == datetime(2024, 1, 1, 0, 45, tzinfo=UTC)
    assert dues("@hourly", "UTC", start, 1) == [datetime(2024, 1, 1, 1, tzinfo=UTC)]
    assert dues("0 0 29 2 *", "UTC", start, 2)[1] == datetime(2028, 2, 29, tzinfo=UTC)
    assert dues("0 0 * * 7", "UTC", start, 1) == [datetime(2024, 1, 7, tzinfo=UTC)]  # 7 is Sunday


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("0 9 * *", "has 4 fields"),
        ("60 * * * *", "minute values are 0-59"),
        ("* 24 * * *", "hour values are 0-23"),
        ("5-1 * * * *", "low to high"),
        ("*/0 * * * *", "at least 1"),
        ("0 0 31 2,4 *", "never matches"),
        ("0 0 L * *", "not a number"),
        ("0 0 * foo *", "not a number or a name"),
    ],
)
def test_a_bad_cron_expression_says_what_is_wrong(expression: str, says: str) -> None:
    with pytest.raises(RecurrenceError, match=says):
        CronSchedule.parse(expression)


@pytest.mark.parametrize(
    ("recurrence", "says"),
    [
        (Recurrence(), "exactly one of cron and interval_ms"),
        (Recurrence(cron="* * * * *", interval_ms=5000), "exactly one"),
        (Recurrence(cron="* * * * *", time_zone="Mars/Olympus"), "unknown time zone"),
        (Recurrence(cron="* * * * *", time_zone="../../etc/passwd"), "unknown time zone"),
        (Recurrence(interval_ms=999), "shortest interval is 1000 ms"),
        (Recurrence(interval_ms=1000, time_zone=PARIS), "time_zone is for cron"),
        (Recurrence(interval_ms=1000, until_ms=5), "before the first due time"),
        (Recurrence(interval_ms=1000, max_count=-1), "max_count=-1"),
        (Recurrence(interval_ms=1000, max_count=2, ordinal=3), "past max_count"),
        (Recurrence(interval_ms=1000, ordinal=2**63 - 1), "the largest is"),
    ],
)
def test_an_invalid_recurrence_is_refused_with_its_reason(recurrence: Recurrence, says: str) -> None:
    with pytest.raises(RecurrenceError, match=says):
        series_of(recurrence, 10_000)


def _series(
    recurrence: Recurrence, due_ms: int, floor_ms: int | None = None, count: int = 10
) -> list[Future]:
    future = Future(id="s", due_ms=due_ms, recurrence=recurrence)
    found = [future]
    while len(found) < count:
        nxt = next_occurrence(found[-1], found[-1].due_ms if floor_ms is None else floor_ms)
        if nxt is None:
            break
        found.append(nxt)
    return found


@pytest.mark.parametrize("cron", ["* * * * *", "59 23 31 12 *", "0 0 29 2 *"])
@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Pacific/Niue"])
def test_a_cron_series_due_at_the_end_of_year_9999_ends_there(cron: str, zone: str) -> None:
    last = ms(9999, 12, 31, 23, 59)
    assert _series(Recurrence(cron=cron, time_zone=zone), last)[1:] == []


def test_an_interval_series_counts_its_occurrences_and_ends_at_max_count() -> None:
    got = _series(Recurrence(interval_ms=30_000, max_count=3), 1_000_000)
    assert [(f.due_ms, f.recurrence.ordinal) for f in got] == [(1_000_000, 0), (1_030_000, 2), (1_060_000, 3)]
    assert all(f.recurrence.first_due_ms == 1_000_000 for f in got[1:])
    assert all(f.id == "s" for f in got)


def test_a_series_ends_at_until_inclusive() -> None:
    got = _series(Recurrence(interval_ms=1000, until_ms=4000), 1000)
    assert [f.due_ms for f in got] == [1000, 2000, 3000, 4000]


def test_occurrences_that_came_due_while_the_current_one_waited_are_skipped() -> None:
    current = Future(id="s", due_ms=10_000, recurrence=Recurrence(interval_ms=1000, ordinal=4))
    # Fired 5.5 s late: 11 000 .. 15 000 are past; the series goes on at 16 000, as occurrence 5.
    nxt = next_occurrence(current, 15_500)
    assert nxt is not None
    assert (nxt.due_ms, nxt.recurrence.ordinal) == (16_000, 5)


# -- fuzzing and properties ----------------------------------------------------

_cron_atoms = st.sampled_from(
    ["*", "*/5", "1-5", "0", "59", "7", "mon-fri", "jan", "L", "", "-", "/", "1-", "?"]
)
_cron_like = st.lists(
    st.lists(_cron_atoms, min_size=1, max_size=3).map(",".join), min_size=0, max_size=6
).map(" ".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=80), _cron_like))
def test_any_text_parses_or_is_refused_with_a_value_error(text: str) -> None:
    try:
        schedule = CronSchedule.parse(text)
    except ValueError:
        return
    assert schedule.minutes and schedule.hours and schedule.days and schedule.months and schedule.weekdays


_i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _recurrences(draw: st.DrawFn) -> Recurrence:
    recurrence = Recurrence(
        cron=draw(st.one_of(st.just(""), _cron_like, st.text(max_size=20))),
        time_zone=draw(
            st.one_of(st.just(""), st.sampled_from([PARIS, NEW_YORK, "Nowhere/X"]), st.text(max_size=20))
        ),
        interval_ms=draw(st.one_of(st.just(0), st.integers(0, 10**6), _i64)),
        max_count=draw(st.one_of(st.integers(0, 5), _i64)),
        ordinal=draw(st.one_of(st.integers(0, 5), _i64)),
        first_due_ms=draw(st.one_of(st.just(0), _i64)),
    )
    until = draw(st.one_of(st.none(), _i64))
    if until is not None:
        recurrence.until_ms = until
    return recurrence


@settings(max_examples=300, deadline=None)
@given(_recurrences(), st.integers(0, 253_402_300_799_999), st.integers(0, 253_402_300_799_999))
def test_any_recurrence_is_a_series_or_a_value_error(recurrence: Recurrence, due_ms: int, floor: int) -> None:
    current = Future(id="s", due_ms=due_ms, recurrence=recurrence)
    try:
        series_of(recurrence, due_ms)
    except ValueError:
        assert next_occurrence(current, floor) is None  # a series the worker refuses never goes on
        return
    nxt = next_occurrence(current, floor)
    assert nxt is None or nxt.due_ms > max(due_ms, floor)


_zones = st.sampled_from([PARIS, NEW_YORK, "UTC", "Australia/Lord_Howe", "America/Santiago"])
_crons = st.sampled_from(
    ["*/7 * * * *", "30 2 * * *", "0,30 1-3 * * *", "15 */3 * * 0,3", "0 0 29 2 *", "59 23 * * *"]
)
# Around the DST changes of 2024 and beyond.
_starts = st.integers(ms(2024, 1, 1), ms(2030, 1, 1))


def _matches(cron: CronSchedule, local: datetime) -> bool:
    weekday = (local.weekday() + 1) % 7
    day = (
        (local.day in cron.days or weekday in cron.weekdays)
        if cron.either_day
        else (local.day in cron.days and weekday in cron.weekdays)
    )
    return local.minute in cron.minutes and local.hour in cron.hours and local.month in cron.months and day


@settings(max_examples=150, deadline=None)
@given(_crons, _zones, _starts)
def test_each_next_occurrence_is_later_never_early_and_a_match_or_a_gap_end(
    cron_text: str, zone: str, start: int
) -> None:
    series = series_of(Recurrence(cron=cron_text, time_zone=zone), start)
    cron = CronSchedule.parse(cron_text)
    tz = ZoneInfo(zone)
    at = start
    for _ in range(8):
        nxt = series.next_after(at, at)
        assert nxt is not None and nxt > at
        local = utc(nxt).astimezone(tz)
        if not _matches(cron, local.replace(tzinfo=None)):
            # Not a match itself: the end of a gap, where a skipped match fires.
            before = utc(nxt - 1).astimezone(tz)
            assert local.utcoffset() != before.utcoffset()
        elif local.fold:
            # A repeated local time fires only its first instant.
            pytest.fail(f"{cron_text} in {zone} fired the second pass of {local}")
        # Never early: no match lies strictly between two consecutive occurrences.
        probe = at + 60_000 - at % 60_000
        while probe < min(nxt, at + 2 * 86_400_000):  # a rare match (29 February) is not walked to
            seen = utc(probe).astimezone(tz)
            assert seen.fold or not _matches(cron, seen.replace(tzinfo=None)), f"skipped {seen}"
            probe += 60_000
        at = nxt


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1000, 10**9),
    st.integers(0, 10**12),
    st.integers(0, 10**10),
)
def test_interval_occurrences_stay_on_their_grid_after_any_delay(interval: int, due: int, late: int) -> None:
    current = Future(id="s", due_ms=due, recurrence=Recurrence(interval_ms=interval))
    nxt = next_occurrence(current, due + late)
    assert nxt is not None
    assert nxt.due_ms > due + late
    assert (nxt.due_ms - due) % interval == 0
    assert nxt.due_ms - interval <= due + late  # the first on the grid after the floor
    assert nxt.recurrence.ordinal == 2
