"""Parse the human-friendly durations and instants the CLI accepts.

Pure functions, no Kafka: ``parse_duration("1m30s") == 90.0`` (seconds) and
``parse_instant("2026-11-21T17:00:00Z")`` → epoch seconds. Both raise
``ValueError`` with a message that shows an accepted form.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

# Seconds per unit. "ms" must be tried before "m", which the alternation order ensures.
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")

DURATION_HELP = "a number of seconds (1.5) or units ms/s/m/h/d, combined largest first (250ms, 1m30s, 2h, 3d)"
INSTANT_HELP = (
    "an ISO 8601 time with a zone (2026-11-21T17:00:00Z, 2026-11-21T18:00:00+01:00) or epoch seconds"
)

# Epoch seconds beyond this (year 5138) are almost certainly epoch milliseconds.
_MAX_EPOCH_S = 1e11


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``"1.5"``, ``"250ms"``, ``"5s"``, ``"1m30s"``, ``"2h"``, ``"3d"``.

    Units must appear at most once each, largest first (``"30s1m"`` is refused as
    a likely typo). Negative durations are refused: a timer cannot fire in the past
    relative to now.
    """
    raw = text.strip().lower()
    if not raw:
        raise ValueError(f"empty duration: use {DURATION_HELP}")
    if _NUMBER.fullmatch(raw):
        return float(raw)
    pos = 0
    total = 0.0
    last_size = math.inf
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        size = _UNITS[match.group(2)]
        if size >= last_size:
            raise ValueError(f"duration {text!r}: repeat each unit at most once, largest first (like 1h30m)")
        last_size = size
        total += float(match.group(1)) * size
        pos = match.end()
    if pos != len(raw) or pos == 0:
        raise ValueError(f"invalid duration {text!r}: use {DURATION_HELP}")
    return total


def parse_instant(text: str) -> float:
    """Epoch seconds of ``text``: ISO 8601 with a zone (``Z`` or ``+01:00``) or epoch seconds.

    A time without a zone is refused rather than guessed: the machine's local zone
    is rarely what a timer in a distributed system means.
    """
    raw = text.strip()
    if not raw:
        raise ValueError(f"empty time: use {INSTANT_HELP}")
    if _NUMBER.fullmatch(raw):
        seconds = float(raw)
        if seconds >= _MAX_EPOCH_S:
            raise ValueError(
                f"time {text!r} looks like epoch milliseconds: give epoch seconds ({seconds / 1000:.3f})"
            )
        return seconds
    try:
        when = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ValueError(f"invalid time {text!r}: use {INSTANT_HELP}") from exc
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"time {text!r} has no zone: append Z for UTC or an offset like +01:00")
    return when.timestamp()
