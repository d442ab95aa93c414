"""Validation of admin API input: every bad value becomes an :class:`ApiError` with a 4xx status.

Pure functions over plain strings and mappings, so they are tested without a server.
Times are epoch milliseconds (``*_ms``) or seconds (``*_s``), as the names say. What each
accepts is what ``openapi.py`` states: a query parameter given is a value of its schema (an
empty one is no integer, no enum member), and a route takes no parameter it does not list.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from futures.ingress.base import MAX_DUE_MS
from futures.worker.table import table_key
from ktimers.deadletter import short

#: The end of every range of due times (exclusive): just after the latest due time the
#: ingest accepts (``MAX_DUE_MS``, the end of year 9999).
END_MS = MAX_DUE_MS + 1
#: Page size of listings: default and ceiling.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: Default page of recent firings.
FIRINGS_LIMIT = 50
#: A reschedule further ahead than this is refused (100 years): almost surely a unit mix-up.
MAX_DELAY_S = 100 * 365 * 86400

_INT = re.compile(r"-?[0-9]+")
#: Digits beyond leading zeros past which an integer is out of every range here (and
#: ``int()`` is never asked to read a megabyte of digits).
_MAX_DIGITS = 20


def _shown(raw: str) -> str:
    """A value quoted in an error: its start only (a query string may be megabytes)."""
    return repr(short(raw, 80))


class ApiError(Exception):
    """A request the API refuses: HTTP ``status`` and a message saying what to fix."""

    def __init__(self, status: int, message: str, **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


def timer_id(raw: str) -> str:
    """A timer id to look up: any non-empty text (one longer than the wire's
    ``MAX_ID_BYTES`` is simply never pending)."""
    if not raw:
        raise ApiError(400, "the timer id is empty")
    return raw


def only(query: Mapping[str, str], names: tuple[str, ...]) -> None:
    """Refuse a query parameter the route does not take: a misspelt one would be ignored."""
    unknown = sorted(set(query) - set(names))
    if unknown:
        takes = f"it takes {', '.join(names)}" if names else "it takes none"
        raise ApiError(400, f"unknown query parameter(s) {', '.join(map(_shown, unknown))}: {takes}")


def integer(query: Mapping[str, str], name: str, low: int, high: int, what: str = "an integer") -> int | None:
    """The integer ``name`` in ``low..high`` from the query string; None when absent."""
    raw = query.get(name)
    if raw is None:
        return None
    value = int(raw) if _INT.fullmatch(raw) and len(raw.lstrip("-0")) <= _MAX_DIGITS else None
    if value is None or not low <= value <= high:
        raise ApiError(400, f"{name}={_shown(raw)}: expected {what} from {low} to {high}")
    return value


def epoch_ms(query: Mapping[str, str], name: str, default: int) -> int:
    """A bound of a range of due times (epoch milliseconds) from the query string."""
    value = integer(query, name, 0, END_MS, "epoch milliseconds, an integer")
    return default if value is None else value


def limit(query: Mapping[str, str], default: int = DEFAULT_LIMIT, ceiling: int = MAX_LIMIT) -> int:
    value = integer(query, "limit", 1, ceiling)
    return default if value is None else value


def partition(query: Mapping[str, str], partitions: int) -> int | None:
    return integer(query, "partition", 0, partitions - 1)


def flag(query: Mapping[str, str], name: str) -> bool:
    """A yes/no query parameter: ``1`` or ``0``; absent is no."""
    return integer(query, name, 0, 1, "1 or 0, an integer") == 1


def choice(query: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; the first is the default."""
    raw = query.get(name, choices[0])
    if raw not in choices:
        raise ApiError(400, f"{name}={_shown(raw)}: expected one of {', '.join(choices)}")
    return raw


@dataclass(frozen=True)
class Cursor:
    """Where a page of a listing ended: the last timer's due time and id.

    Table keys order timers by (due_ms, id) in every partition alike, so one
    cursor resumes a listing merged over several partitions.
    """

    due_ms: int
    timer_id: str

    def encode(self) -> str:
        return f"{self.due_ms}:{self.timer_id}"

    @property
    def key(self) -> bytes:
        return table_key(self.due_ms, self.timer_id)


#: What a cursor looks like (the schema's ``pattern``): a due time, ``:``, an id. Any such
#: text only positions the scan, so nothing more is asked of it.
CURSOR_PATTERN = r"^[0-9]{1,15}:[\s\S]+$"
_CURSOR = re.compile(CURSOR_PATTERN)


def cursor(query: Mapping[str, str]) -> Cursor | None:
    raw = query.get("after")
    if raw is None:
        return None
    if not _CURSOR.fullmatch(raw):
        raise ApiError(400, f"after={_shown(raw)}: pass the 'next' value of the previous page unchanged")
    due, _, ident = raw.partition(":")
    return Cursor(int(due), ident)


@dataclass(frozen=True)
class NewDueTime:
    due_ms: int


def reschedule_body(body: object, now_ms: int) -> NewDueTime:
    """``{"due_ms": <epoch ms>}`` or ``{"delay_s": <seconds from now>}``, exactly one."""
    if not isinstance(body, dict):
        raise ApiError(400, 'expected a JSON object: {"due_ms": <epoch ms>} or {"delay_s": <seconds>}')
    unknown = sorted(set(body) - {"due_ms", "delay_s"})
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(unknown)}: give due_ms or delay_s")
    if ("due_ms" in body) == ("delay_s" in body):
        raise ApiError(400, "give exactly one of due_ms (epoch milliseconds) and delay_s (seconds from now)")
    if "due_ms" in body:
        due = body["due_ms"]
        if isinstance(due, bool) or not isinstance(due, int) or not 0 <= due <= MAX_DUE_MS:
            raise ApiError(
                400, f"due_ms={due!r}: expected epoch milliseconds, an integer from 0 to {MAX_DUE_MS}"
            )
        return NewDueTime(due)
    delay = body["delay_s"]
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay):
        raise ApiError(400, f"delay_s={delay!r}: expected a number of seconds")
    if not 0 <= delay <= MAX_DELAY_S:
        raise ApiError(400, f"delay_s={delay!r}: expected 0 to {MAX_DELAY_S} seconds")
    return NewDueTime(now_ms + round(delay * 1000))
