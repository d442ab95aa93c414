"""The compaction of a crafted log computed the slow, obvious way: a test oracle, not product code.

Every record goes through the worker's parser one by one (what the jobs did
before their fast path), and the versions are classified in plain Python by the
rules of :mod:`futures.jobs.versions`, without Spark.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, RequestParser, Schedule
from futures.jobs.decode import CANCEL, INVALID, SCHEDULE, TOMBSTONE
from ktimers.wire import TimerEvent, decode_events

NOW_MS = 1_795_000_000_000


@dataclass(frozen=True)
class Expected:
    pending: dict[tuple[int, str], tuple[str, int, int, int, bytes]]  # → (topic, offset, idx, due_ms, future)
    statuses: Counter[str]
    invalid: Counter[str]  # by reason
    events: tuple[int, int]  # (read, undecodable or tombstones)


def _stamp_ms(when: Any) -> int:
    return -1 if when is None else int(when.timestamp() * 1000)


def decode(rows: list[tuple], config: ParseLimits) -> list[dict[str, Any]]:
    """Request rows of raw Kafka rows (``tests.jobs.crafted.Log.rows``), record by record."""
    parser = RequestParser(config, NOW_MS)
    out = []
    for key, value, topic, partition, offset, when, headers in rows:
        record = SourceRecord(topic, partition, offset, key, value,
                              tuple((h["key"], h["value"]) for h in headers), _stamp_ms(when))  # fmt: skip
        for idx, request in enumerate(parser.parse(record)):
            row: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset, "idx": idx,
                                   "ts": record.timestamp_ms, "due_ms": None, "future": None}  # fmt: skip
            if isinstance(request, Schedule):
                future = request.timer.future
                row.update(kind=SCHEDULE, timer_id=request.timer_id, due_ms=request.due_ms,
                           future=future.SerializeToString())  # fmt: skip
            elif isinstance(request, CancelRequest):
                row.update(kind=CANCEL, timer_id=request.timer_id)
            else:
                reason = TOMBSTONE if value is None else request.reason
                row.update(kind=INVALID, timer_id=request.timer_id or None, reason=reason)
            out.append(row)
    return out


def compact(request_rows: list[tuple], event_rows: list[tuple], config: ParseLimits) -> Expected:
    rows = decode(request_rows, config)
    topics = len(config.topics.ingress_formats)
    # Log order: offsets within a topic; across topics, record times made monotonic per topic partition.
    seq: dict[int, int] = {}
    along: dict[tuple[str, int], list[int]] = defaultdict(list)
    for n, row in enumerate(rows):
        along[(row["topic"], row["partition"])].append(n)
    for members in along.values():
        high = -1
        for n in sorted(members, key=lambda m: (rows[m]["offset"], rows[m]["idx"])):
            high = max(high, rows[n]["ts"])
            seq[n] = high if topics > 1 else 0
    fired, rejected, dropped = set(), set(), set()
    bad_events = 0
    events_read = 0
    for _, value, *_rest, headers in event_rows:
        try:
            if value is None:
                raise ValueError("tombstone")
            events = [
                (event, TimerEvent.Kind.Name(event.kind))
                for event in decode_events(value, [(h["key"], h["value"]) for h in headers])
            ]
        except Exception:  # noqa: BLE001 - undecodable, as the job counts it
            bad_events += 1
            events_read += 1
            continue
        events_read += len(events)
        for event, kind in events:
            if kind == "FIRED" and event.source_offset >= 0:
                fired.add((event.partition, event.id, event.source_offset))
            elif kind == "REJECTED" and event.source_offset >= 0:
                rejected.add((event.partition, event.id, event.source_offset))
            elif kind == "REJECTED":
                dropped.add((event.partition, event.id, event.due_ms))
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for n, row in enumerate(rows):
        groups[(row["partition"], row["timer_id"], row["kind"] != INVALID)].append(n)
    statuses: Counter[str] = Counter()
    invalid: Counter[str] = Counter()
    pending = {}
    for (partition, timer_id, valid), members in groups.items():
        members.sort(key=lambda m: (seq[m], rows[m]["topic"], rows[m]["offset"], rows[m]["idx"]))
        for position, n in enumerate(members):
            row = rows[n]
            following = rows[members[position + 1]]["kind"] if position + 1 < len(members) else None
            if not valid:
                status = "invalid"
                invalid[row["reason"] or "unknown"] += 1
            elif row["kind"] == CANCEL:
                status = "cancel"
            elif (partition, timer_id, row["offset"]) in fired:
                status = "fired"
            elif (partition, timer_id, row["offset"]) in rejected or (
                partition,
                timer_id,
                row["due_ms"],
            ) in dropped:
                status = "rejected"
            elif following == CANCEL:
                status = "cancelled"
            elif following is not None:
                status = "superseded"
            else:
                status = "pending"
                pending[(partition, timer_id)] = (row["topic"], row["offset"], row["idx"], row["due_ms"],
                                                  row["future"])  # fmt: skip
            statuses[status] += 1
    return Expected(pending, statuses, invalid, (events_read, bad_events))
