"""The read side of the admin API: JSON views of the tables this worker holds and of its status.

Every listing is a bounded range scan over keys ordered by due time (see
``PartitionTimers.iter_range``); nothing here walks a whole table. Functions take
the held tables as a mapping, so they are tested on RocksDB under ``tmp_path``.

Times in the JSON are epoch milliseconds (``*_ms``) or seconds (``*_s``).
"""

from __future__ import annotations

import base64
import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from futures.worker.admin.params import END_MS, Cursor
from futures.worker.status import PartitionTicks, WorkerStatus
from futures.worker.table import DueTimer, PartitionTimers
from ktimers.recurrence import RecurrenceError, ordinal_of, series_of
from ktimers.wire import Future, StoredTimer, text_or_repr

Json = dict[str, Any]

#: Bytes of a callback payload shown by the detail view.
PAYLOAD_PREVIEW_BYTES = 4096
#: Timers counted per partition for the timeline; beyond it the timeline says "truncated".
TIMELINE_SCAN_LIMIT = 20_000
#: window name → (bucket width in seconds, number of buckets)
TIMELINE_WINDOWS = {"hour": (60, 60), "day": (1800, 48)}


@dataclass(frozen=True)
class Holding:
    """The partitions this worker holds now, and the worker URL of each one it does not."""

    tables: Mapping[int, PartitionTimers]
    elsewhere: Mapping[int, str]

    def elsewhere_json(self) -> dict[str, list[int]]:
        """Worker URL → partitions it holds (as Faust's partition assignor last saw them)."""
        by_url: dict[str, list[int]] = {}
        for partition, url in sorted(self.elsewhere.items()):
            by_url.setdefault(url, []).append(partition)
        return by_url


@dataclass(frozen=True)
class Located:
    partition: int
    due: DueTimer

    @property
    def timer(self) -> StoredTimer:
        return StoredTimer.FromString(self.due.value)


def find(tables: Mapping[int, PartitionTimers], timer_id: str) -> Located | None:
    """The pending timer with this id in the held partitions (two index reads each)."""
    for partition, table in sorted(tables.items()):
        due_ms = table.due_of(timer_id)
        if due_ms is None:
            continue
        value = table.get(due_ms, timer_id)
        if value is not None:
            return Located(partition, DueTimer(b"", due_ms, timer_id, value))
    return None


def summary_json(located: Located) -> Json:
    future = located.timer.future
    return {
        "id": located.due.timer_id,
        "partition": located.partition,
        "due_ms": located.due.due_ms,
        "callback_topic": future.callBackTopic,
        "callback_key": future.callBackKey,
        "payload_bytes": len(future.callBack),
    }


def detail_json(located: Located, with_payload: bool = False) -> Json:
    """One timer. Its payload and header values are what its user put in it, often personal
    data: they are in the answer only ``with_payload`` (the payload's first
    PAYLOAD_PREVIEW_BYTES), and otherwise only their sizes are."""
    stored = located.timer
    future = stored.future
    detail: Json = {
        **summary_json(located),
        # The token is a receiver's secret; whether there is one is enough here.
        "has_token": bool(future.token),
        "headers": [{"key": h.key, "value_bytes": len(h.value)} for h in future.headers],
        "source_partition": stored.source_partition,
        "source_offset": stored.source_offset,
        "accepted_ms": stored.accepted_ms,
        "payload_shown": with_payload,
    }
    if future.HasField("recurrence"):
        detail["series"] = series_json(future)
    if not with_payload:
        return detail
    payload = future.callBack[:PAYLOAD_PREVIEW_BYTES]
    try:
        shown, encoding = payload.decode(), "utf-8"
    except UnicodeDecodeError:
        shown, encoding = base64.b64encode(payload).decode(), "base64"
    for header, h in zip(detail["headers"], future.headers, strict=True):
        header["value"] = text_or_repr(h.value)
    return {
        **detail,
        "payload": shown,
        "payload_encoding": encoding,
        "payload_truncated": len(future.callBack) > PAYLOAD_PREVIEW_BYTES,
    }


def series_json(future: Future) -> Json:
    """A recurring timer's series: its rule, the pending occurrence (``occurrence``, due at the
    timer's ``due_ms``) and the one after it, if its rule and limits leave one."""
    recurrence = future.recurrence
    try:
        # The one after the pending occurrence, were that to fire on time.
        following = series_of(recurrence, future.due_ms).next_after(future.due_ms, future.due_ms)
    except RecurrenceError:
        following = None
    ordinal = ordinal_of(recurrence)
    if recurrence.max_count and ordinal >= recurrence.max_count:
        following = None
    return {
        "cron": recurrence.cron or None,
        "time_zone": (recurrence.time_zone or "UTC") if recurrence.cron else None,
        "interval_ms": recurrence.interval_ms or None,
        "until_ms": recurrence.until_ms if recurrence.HasField("until_ms") else None,
        "max_count": recurrence.max_count or None,
        "occurrence": ordinal,
        "first_due_ms": recurrence.first_due_ms or future.due_ms,
        "following_due_ms": following,
    }


def list_range(
    tables: Mapping[int, PartitionTimers], from_ms: int, to_ms: int, after: Cursor | None, limit: int
) -> tuple[list[Located], Cursor | None]:
    """One page of pending timers due in ``[from_ms, to_ms)``, earliest first, over ``tables``.

    Each partition contributes at most ``limit + 1`` timers from one range scan;
    the merge keeps the first ``limit``. The cursor is None on the last page.
    """
    after_key = after.key if after is not None else None
    scans = [
        [Located(p, due) for due in table.iter_range(from_ms, to_ms, after_key, limit + 1)]
        for p, table in sorted(tables.items())
    ]
    merged = list(heapq.merge(*scans, key=lambda located: (located.due.key, located.partition)))
    page = merged[:limit]
    more = len(merged) > limit
    return page, Cursor(page[-1].due.due_ms, page[-1].due.timer_id) if more else None


def next_due_ms(tables: Mapping[int, PartitionTimers]) -> int | None:
    firsts = [due.due_ms for table in tables.values() for due in table.iter_range(0, END_MS, limit=1)]
    return min(firsts, default=None)


def partition_json(
    partition: int, table: PartitionTimers, ticks: PartitionTicks | None, now_ms: int, stall_after_s: float
) -> Json:
    """Pending count and watermark of one partition; ``stalled`` when it is behind the worker's clock."""
    watermark = table.watermark if table.watermark >= 0 else None
    lag_s = None if watermark is None else max(now_ms / 1000 - watermark, 0.0)
    if watermark is None or lag_s is None:
        stall = "no tick has moved this partition's watermark yet"
    elif lag_s > stall_after_s:
        stall = f"watermark {lag_s:.0f}s behind the worker's clock: no oscillator ticks, or firing is stuck"
    else:
        stall = None
    return {
        "partition": partition,
        "pending": table.pending,
        "watermark_s": watermark,
        "clock_lag_s": None if lag_s is None else round(lag_s, 3),
        "last_tick_s": ticks.second if ticks else None,
        "last_tick_age_s": round((now_ms - ticks.received_ms) / 1000, 3) if ticks else None,
        "last_tick_source": ticks.source if ticks else None,
        "stalled": stall is not None,
        "stall_reason": stall,
    }


def partitions_json(holding: Holding, status: WorkerStatus, stall_after_s: float) -> list[Json]:
    now = status.now_ms()
    ticks = status.partition_ticks()
    return [
        partition_json(p, table, ticks.get(p), now, stall_after_s)
        for p, table in sorted(holding.tables.items())
    ]


def oscillators_json(status: WorkerStatus, stall_after_s: float) -> list[Json]:
    now = status.now_ms()
    return [
        {
            "source": seen.source,
            "last_second": seen.last_second,
            "last_seen_ms": seen.last_seen_ms,
            "age_s": round((now - seen.last_seen_ms) / 1000, 3),
            "ticks": seen.ticks,
            "stale": now - seen.last_seen_ms > stall_after_s * 1000,
        }
        for seen in status.oscillators()
    ]


def firings_json(status: WorkerStatus, limit: int) -> list[Json]:
    return [
        {
            "id": f.timer_id,
            "partition": f.partition,
            "due_ms": f.due_ms,
            "fired_ms": f.fired_ms,
            "lateness_s": f.lateness_ms / 1000,
        }
        for f in status.recent_firings(limit)
    ]


def stats_json(holding: Holding, status: WorkerStatus, stall_after_s: float) -> Json:
    lateness = status.lateness()
    return {
        "now_ms": status.now_ms(),
        "pending": sum(t.pending for t in holding.tables.values()),
        "next_due_ms": next_due_ms(holding.tables),
        "fired_last_minute": status.fired_last_minute(),
        "lateness": {
            "p50_s": lateness.p50_s,
            "p99_s": lateness.p99_s,
            "max_s": lateness.max_s,
            "samples": lateness.samples,
        },
        "dead_letters": {
            reason: {"count": d.count, "last_ms": d.last_ms}
            for reason, d in sorted(status.dead_letters().items())
        },
        "partitions": partitions_json(holding, status, stall_after_s),
        "elsewhere": holding.elsewhere_json(),
        "oscillators": oscillators_json(status, stall_after_s),
    }


def timeline_json(tables: Mapping[int, PartitionTimers], now_ms: int, window: str) -> Json:
    """Pending timers per bucket over the next hour or day (and those already overdue)."""
    width_s, count = TIMELINE_WINDOWS[window]
    start_ms = now_ms - now_ms % (width_s * 1000)
    end_ms = start_ms + width_s * 1000 * count
    buckets = [0] * count
    overdue = 0
    truncated = False
    for table in tables.values():
        scanned = 0
        for due in table.iter_range(0, end_ms, limit=TIMELINE_SCAN_LIMIT):
            scanned += 1
            if due.due_ms < now_ms:
                overdue += 1
            else:
                buckets[(due.due_ms - start_ms) // (width_s * 1000)] += 1
        truncated = truncated or scanned >= TIMELINE_SCAN_LIMIT
    return {
        "window": window,
        "start_ms": start_ms,
        "bucket_s": width_s,
        "buckets": buckets,
        "overdue": overdue,
        "truncated": truncated,
    }
