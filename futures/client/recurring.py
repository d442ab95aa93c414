"""Recurring timers in the client: ``schedule(..., cron=..., tz=...)`` or ``every=...``.

The recurrence is checked here with the worker's own rules (:mod:`ktimers.recurrence`),
so a bad cron expression or zone is a ``ValueError`` at the call, not a dead letter later.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypedDict

from ktimers.recurrence import series_of
from ktimers.timers_pb2 import Recurrence


class RecurrenceOptions(TypedDict, total=False):
    """A recurring timer (see :class:`~futures.client.records.ScheduleOptions`): exactly one of
    ``cron`` (five fields, in zone ``tz``, default UTC) and ``every`` (seconds >= 1 or a
    timedelta); ``until`` (aware datetime or epoch seconds: no occurrence after it) and
    ``max_count`` (occurrences in all) end the series."""

    cron: str | None
    tz: str | None
    every: float | timedelta | None
    until: datetime | float | None
    max_count: int | None


def is_recurring(cron: str | None, every: float | timedelta | None) -> bool:
    return cron is not None or every is not None


def recurrence_for(
    *,
    cron: str | None,
    tz: str | None,
    every: float | timedelta | None,
    until: datetime | float | None,
    max_count: int | None,
    start_ms: int | None,
    now_ms: int,
    to_ms: Callable[[datetime | float], int],
) -> tuple[Recurrence, int]:
    """The ``Recurrence`` and the first due time (epoch ms) of a recurring timer.

    ``start_ms``: from ``at``/``delay``, if given: a cron series' first occurrence is its
    first match at or after it, an interval series starts there. Without it, a cron series
    starts at its next match after ``now_ms``, an interval series one interval from now.
    ``to_ms`` turns ``until`` into epoch ms (the client's ``at`` rules).
    """
    if (cron is None) == (every is None):
        raise ValueError("give exactly one of cron= (e.g. '0 9 * * *') and every= (seconds or a timedelta)")
    if tz is not None and cron is None:
        raise ValueError("tz= is the time zone of cron=; an interval (every=) is the same in every zone")
    if max_count is not None and (
        isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1
    ):
        raise ValueError(f"max_count={max_count!r}: give a whole number of occurrences >= 1")
    recurrence = Recurrence(max_count=max_count or 0)
    if cron is not None:
        if not isinstance(cron, str):
            raise ValueError(f"cron= is a five-field expression (text), not {type(cron).__name__}")
        recurrence.cron = cron
        recurrence.time_zone = tz or ""
    else:
        seconds = every.total_seconds() if isinstance(every, timedelta) else every
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ValueError(f"every={every!r}: give seconds (>= 1) or a timedelta")
        recurrence.interval_ms = round(seconds * 1000)
    if until is not None:
        recurrence.until_ms = to_ms(until)
    # Checked once with a provisional first due, to learn the schedule (or why it is wrong).
    series = series_of(_without_until(recurrence), now_ms)
    if cron is not None:
        after = now_ms if start_ms is None else start_ms - 1
        first = series.next_after(after, after)
        if first is None:
            raise ValueError(f"cron={cron!r} has no occurrence in the next years")
    else:
        first = now_ms + recurrence.interval_ms if start_ms is None else start_ms
    series_of(recurrence, first)  # until before the first occurrence, and the rest
    return recurrence, first


def _without_until(recurrence: Recurrence) -> Recurrence:
    copy = Recurrence()
    copy.CopyFrom(recurrence)
    copy.ClearField("until_ms")
    return copy
