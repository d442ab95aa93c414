"""Validation of admin API input: every bad value becomes an :class:`ApiError` with a 4xx status.

Pure functions over plain strings and mappings, so they are tested without a server.
Times are epoch milliseconds (``*_ms``) or seconds (``*_s``), as the names say.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from futures.worker.table import table_key
from ktimers.wire import MAX_ID_BYTES

#: Largest due time a timer can have (``Future.due_ms`` is an int64).
MAX_DUE_MS = 2**63 - 1
#: Page size of listings: default and ceiling.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: A reschedule further ahead than this is refused (100 years): almost surely a unit mix-up.
MAX_DELAY_S = 100 * 365 * 86400

_INT = re.compile(r"[0-9]{1,19}")


class ApiError(Exception):
    """A request the API refuses: HTTP ``status`` and a message saying what to fix."""

    def __init__(self, status: int, message: str, **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


def timer_id(raw: str) -> str:
    if not raw:
        raise ApiError(400, "the timer id is empty")
    if len(raw.encode()) > MAX_ID_BYTES:
        raise ApiError(400, f"the timer id is longer than {MAX_ID_BYTES} bytes")
    return raw


def epoch_ms(query: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative integer of epoch milliseconds from the query string."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not _INT.fullmatch(raw) or int(raw) > MAX_DUE_MS:
        raise ApiError(400, f"{name}={raw!r}: expected epoch milliseconds, an integer from 0 to {MAX_DUE_MS}")
    return int(raw)


def limit(query: Mapping[str, str], default: int = DEFAULT_LIMIT, ceiling: int = MAX_LIMIT) -> int:
    raw = query.get("limit")
    if raw is None or raw == "":
        return default
    if not _INT.fullmatch(raw) or not 1 <= int(raw) <= ceiling:
        raise ApiError(400, f"limit={raw!r}: expected an integer from 1 to {ceiling}")
    return int(raw)


def partition(query: Mapping[str, str], partitions: int) -> int | None:
    raw = query.get("partition")
    if raw is None or raw == "":
        return None
    if not _INT.fullmatch(raw) or int(raw) >= partitions:
        raise ApiError(400, f"partition={raw!r}: expected an integer from 0 to {partitions - 1}")
    return int(raw)


def flag(query: Mapping[str, str], name: str) -> bool:
    """A yes/no query parameter: ``1``/``true`` or ``0``/``false``; absent or empty is no."""
    raw = query.get(name) or "0"
    if raw.lower() in ("1", "true"):
        return True
    if raw.lower() in ("0", "false"):
        return False
    raise ApiError(400, f"{name}={raw!r}: expected 1 or 0 (true or false)")


def choice(query: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; the first is the default."""
    raw = query.get(name) or choices[0]
    if raw not in choices:
        raise ApiError(400, f"{name}={raw!r}: expected one of {', '.join(choices)}")
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


def cursor(query: Mapping[str, str]) -> Cursor | None:
    raw = query.get("after")
    if raw is None or raw == "":
        return None
    due, sep, ident = raw.partition(":")
    if not sep or not ident or not _INT.fullmatch(due) or int(due) > MAX_DUE_MS:
        raise ApiError(400, f"after={raw!r}: pass the 'next' value of the previous page unchanged")
    return Cursor(int(due), timer_id(ident))


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
