"""Recurring timers: what a ``Recurrence`` means, shared by the client, the worker and the jobs.

A recurring timer is one stored timer at a time: its current occurrence. When it
fires, the worker replaces it with the next occurrence (:func:`next_occurrence`),
same id, in the same changelog write that removes the current one.

Cron expressions have the five classic fields — minute (0-59), hour (0-23), day of
month (1-31), month (1-12 or ``jan``-``dec``), day of week (0-7, 0 and 7 are Sunday,
or ``sun``-``sat``) — each ``*``, a value, a range ``a-b``, a step ``*/n``, ``a-b/n``
or ``a/n``, or a list of those separated by commas; and the macros ``@yearly``
(``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and
``@hourly``. As in Vixie cron, when both day fields are restricted (neither starts
with ``*``) a day matches either of them, otherwise both.

They are read in an IANA time zone, correct across daylight-saving changes: a local
time that a spring-forward gap skips fires once, at the first instant after the
gap; a local time that a fall-back repeats fires once, the first time.

Times are epoch **milliseconds** throughout.
"""

from __future__ import annotations

import bisect
import calendar
import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ktimers.wire import H_OCCURRENCE, Future, Recurrence, occurrence_headers, ordinal_of

__all__ = [
    "H_OCCURRENCE",
    "MIN_INTERVAL_MS",
    "CronSchedule",
    "RecurrenceError",
    "Series",
    "next_occurrence",
    "occurrence",
    "occurrence_headers",
    "ordinal_of",
    "series_of",
    "zone_of",
]

#: Shortest interval between occurrences (ms): the worker's resolution is a second.
MIN_INTERVAL_MS = 1000
#: The largest ordinal a producer may give: the worker counts it up, in a 64-bit field.
MAX_ORDINAL = 2**62
#: Longest cron expression and time zone name accepted (characters).
MAX_CRON_CHARS = 256
MAX_ZONE_CHARS = 64
#: A cron expression's next match is looked for this far ahead at most (years): one that
#: can match at all matches within 8 (29 February on a given weekday, across 2100).
_SEARCH_YEARS = 10
#: Latest due time of any timer (epoch ms): 9999-12-31T23:59:59.999Z, as the ingress accepts.
_MAX_DUE_MS = 253_402_300_799_999

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
#: (name, low, high, names) of each field, in order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {k.lower(): v for k, v in _MONTHS.items()}),
    ("day of week", 0, 7, _DAYS),
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINUTE = timedelta(minutes=1)


class RecurrenceError(ValueError):
    """A recurrence that cannot be scheduled: the message says what is wrong and how to write it."""


@dataclass(frozen=True)
class CronSchedule:
    """A parsed five-field cron expression: the allowed values of each field, sorted."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]  # of the month
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    #: Both day fields restricted: a day matches either (Vixie cron), else both.
    either_day: bool

    @classmethod
    def parse(cls, expression: str) -> CronSchedule:
        """Parse ``expression``; :class:`RecurrenceError` (a ``ValueError``) says what is wrong."""
        if not isinstance(expression, str):
            raise RecurrenceError(f"a cron expression is text, not {type(expression).__name__}")
        return _parse_cron(expression)

    @classmethod
    def _parse(cls, expression: str) -> CronSchedule:
        if len(expression) > MAX_CRON_CHARS:
            raise RecurrenceError(f"cron expression longer than {MAX_CRON_CHARS} characters")
        text = expression.strip()
        text = _MACROS.get(text.lower(), text)
        parts = text.split()
        if len(parts) != 5:
            raise RecurrenceError(
                f"cron expression {expression!r} has {len(parts)} fields; expected 5: "
                "minute hour day-of-month month day-of-week (e.g. '0 9 * * 1-5'), or @daily, @hourly..."
            )
        values = [_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True)]
        weekdays = tuple(sorted({d % 7 for d in values[4]}))  # 7 is Sunday too
        schedule = cls(
            expression=text,
            minutes=tuple(sorted(values[0])),
            hours=tuple(sorted(values[1])),
            days=tuple(sorted(values[2])),
            months=tuple(sorted(values[3])),
            weekdays=weekdays,
            either_day=not parts[2].startswith("*") and not parts[4].startswith("*"),
        )
        if not schedule.either_day and not any(
            day <= _longest(month) for month in schedule.months for day in schedule.days
        ):
            raise RecurrenceError(
                f"cron expression {expression!r} never matches: no such day in those months"
            )
        return schedule

    def _day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)

    def next_local(self, start: datetime) -> datetime | None:
        """The first local (naive) time at or after ``start`` (whole minutes) that matches, within
        :data:`_SEARCH_YEARS`; None if there is none (or past year 9999)."""
        t = start.replace(second=0, microsecond=0)
        if t < start:
            t += _MINUTE
        last_year = t.year + _SEARCH_YEARS
        try:
            while t.year <= last_year:
                if t.month not in self.months:
                    i = bisect.bisect_right(self.months, t.month)
                    if i < len(self.months):
                        t = datetime(t.year, self.months[i], 1)
                    else:
                        t = datetime(t.year + 1, self.months[0], 1)
                    continue
                if not self._day_matches(t):
                    t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                    continue
                i = bisect.bisect_left(self.hours, t.hour)
                if i == len(self.hours):
                    t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                    continue
                if self.hours[i] != t.hour:
                    t = t.replace(hour=self.hours[i], minute=0)
                i = bisect.bisect_left(self.minutes, t.minute)
                if i == len(self.minutes):
                    t = t.replace(minute=0) + timedelta(hours=1)
                    continue
                return t.replace(minute=self.minutes[i])
        except (OverflowError, ValueError):
            return None  # past year 9999
        return None


@functools.lru_cache(maxsize=1024)
def _parse_cron(expression: str) -> CronSchedule:
    """Parsed once per expression: a series' next occurrence is computed each time it fires."""
    return CronSchedule._parse(expression)


def _longest(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def _field(part: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    found: set[int] = set()
    for item in part.split(","):
        found |= _item(item, name, low, high, names)
    return found


def _item(item: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    where = f"{name} field {item!r}"
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        step = _number(step_text, where, names={})
        if step < 1:
            raise RecurrenceError(f"{where}: a step must be at least 1")
    if body == "*":
        first, last = low, high
    elif "-" in body[1:]:
        a, _, b = body.partition("-")
        first, last = _number(a, where, names), _number(b, where, names)
        if first > last:
            raise RecurrenceError(f"{where}: a range goes from low to high ({first} > {last})")
    else:
        first = _number(body, where, names)
        last = high if slash else first
    if first < low or last > high:
        raise RecurrenceError(f"{where}: {name} values are {low}-{high}")
    return set(range(first, last + 1, step))


def _number(text: str, where: str, names: dict[str, int]) -> int:
    named = names.get(text.lower())
    if named is not None:
        return named
    if not text.isascii() or not text.isdigit() or len(text) > 4:
        raise RecurrenceError(f"{where}: {text!r} is not a number{' or a name' if names else ''}")
    return int(text)


def zone_of(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (empty: UTC); :class:`RecurrenceError` if there is no such zone."""
    if not name:
        return ZoneInfo("UTC")
    if len(name) > MAX_ZONE_CHARS:
        raise RecurrenceError(f"time zone name longer than {MAX_ZONE_CHARS} characters")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError, UnicodeError) as exc:
        raise RecurrenceError(
            f"unknown time zone {name!r}: give an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from exc


def _ms(instant: datetime) -> int:
    return (instant - _EPOCH) // timedelta(milliseconds=1)


def _at(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


@dataclass(frozen=True)
class Series:
    """A validated recurrence: :meth:`next_after` gives its due times."""

    cron: CronSchedule | None
    zone: ZoneInfo
    interval_ms: int
    until_ms: int | None
    max_count: int  # 0: no limit

    def next_after(self, anchor_ms: int, after_ms: int) -> int | None:
        """The first due time strictly after ``after_ms`` of the series whose occurrence
        ``anchor_ms`` is (``after_ms >= anchor_ms``); None past year 9999 or after ``until_ms``."""
        if self.cron is None:
            steps = max((after_ms - anchor_ms) // self.interval_ms + 1, 1)
            due = anchor_ms + steps * self.interval_ms
        else:
            try:
                found = self._cron_after(after_ms)
            except OverflowError:  # local times near the end of year 9999 leave datetime's range
                return None
            if found is None:
                return None
            due = found
        if due > _MAX_DUE_MS or (self.until_ms is not None and due > self.until_ms):
            return None
        return due

    def _cron_after(self, after_ms: int) -> int | None:
        cron, zone = self.cron, self.zone
        assert cron is not None  # noqa: S101 - the caller checked
        local = _at(after_ms).astimezone(zone).replace(tzinfo=None)
        start = local.replace(second=0, microsecond=0)
        # A local time repeated by a fall-back maps to its first instant, which may be at or
        # before ``after_ms``: such candidates are passed over (at most a few hours of minutes).
        for _ in range(10_000):
            candidate = cron.next_local(start)
            if candidate is None:
                return None
            due = self._instant_ms(candidate)
            if due > after_ms:
                return due
            start = candidate + _MINUTE
        return None

    def _instant_ms(self, local: datetime) -> int:
        """The instant of local time ``local``: the first one if it is repeated, the end of the
        gap if a spring-forward skips it."""
        zone = self.zone
        first = local.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if first.astimezone(zone).replace(tzinfo=None) == local:
            return _ms(first)
        # In a gap: fold=1 reads it with the offset after the change (an instant before it),
        # fold=0 with the one before (an instant after it). The first instant whose local
        # time has reached ``local`` lies between: the change itself.
        lo = _ms(local.replace(tzinfo=zone, fold=1).astimezone(UTC)) // 1000
        hi = _ms(first) // 1000
        lo, hi = min(lo, hi), max(lo, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            if _at(mid * 1000).astimezone(zone).replace(tzinfo=None) >= local:
                hi = mid
            else:
                lo = mid + 1
        return lo * 1000


def series_of(recurrence: Recurrence, due_ms: int) -> Series:
    """The series ``recurrence`` describes, for a timer whose current occurrence is due at
    ``due_ms``; :class:`RecurrenceError` (a ``ValueError``) says what is wrong with it."""
    cron_text, interval = recurrence.cron, recurrence.interval_ms
    if bool(cron_text) == bool(interval):
        raise RecurrenceError("a recurrence sets exactly one of cron and interval_ms")
    cron = None
    if cron_text:
        cron = CronSchedule.parse(cron_text)
        zone = zone_of(recurrence.time_zone)
    else:
        if recurrence.time_zone:
            raise RecurrenceError("time_zone is for cron; an interval is the same in every zone")
        if interval < MIN_INTERVAL_MS:
            raise RecurrenceError(
                f"interval_ms={interval}: the shortest interval is {MIN_INTERVAL_MS} ms (1 s)"
            )
        zone = ZoneInfo("UTC")
    until = recurrence.until_ms if recurrence.HasField("until_ms") else None
    if until is not None and until < due_ms:
        raise RecurrenceError(
            f"until_ms={until} is before the first due time {due_ms}: the series would be empty"
        )
    if recurrence.max_count < 0:
        raise RecurrenceError(f"max_count={recurrence.max_count}: give a count >= 1, or 0 for no limit")
    if recurrence.ordinal < 0:
        raise RecurrenceError(f"ordinal={recurrence.ordinal}: occurrences count from 1")
    if recurrence.ordinal > MAX_ORDINAL:
        raise RecurrenceError(f"ordinal={recurrence.ordinal}: the largest is {MAX_ORDINAL}")
    if recurrence.max_count and ordinal_of(recurrence) > recurrence.max_count:
        raise RecurrenceError(
            f"ordinal={recurrence.ordinal} is past max_count={recurrence.max_count}: the series is over"
        )
    if recurrence.first_due_ms < 0 or recurrence.first_due_ms > due_ms:
        raise RecurrenceError(
            f"first_due_ms={recurrence.first_due_ms} is negative or after the occurrence due at {due_ms}"
        )
    return Series(cron, zone, interval, until, recurrence.max_count)


def next_occurrence(future: Future, floor_ms: int) -> Future | None:
    """The next occurrence of the recurring timer ``future`` (whose current occurrence just
    fired), or None when its series is over (``until_ms``, ``max_count``, an invalid one).

    Occurrences due at or before ``floor_ms`` — those that came due while the current one
    waited to fire (a worker down, ticks missing) — are skipped: after an outage a series
    fires its pending occurrence once, late, then goes on on schedule. The result is
    ``future`` with the next due time and ordinal, and the first due time filled in.
    """
    recurrence = future.recurrence
    due_ms = future.due_ms
    try:
        series = series_of(recurrence, due_ms)
    except RecurrenceError:
        return None  # refused at ingest: only a timer stored by hand gets here
    ordinal = ordinal_of(recurrence)
    if series.max_count and ordinal >= series.max_count:
        return None
    due = series.next_after(due_ms, max(due_ms, floor_ms))
    if due is None:
        return None
    return occurrence(future, due, ordinal + 1)


def occurrence(future: Future, due_ms: int, ordinal: int) -> Future:
    """Occurrence ``ordinal`` of the series whose occurrence ``future`` is, due at ``due_ms``
    (epoch ms): ``future`` with that due time and ordinal, and its series' first due time
    filled in."""
    following = Future()
    following.CopyFrom(future)
    following.due_ms = due_ms
    following.recurrence.ordinal = ordinal
    following.recurrence.first_due_ms = future.recurrence.first_due_ms or future.due_ms
    return following
