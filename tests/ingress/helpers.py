"""Building request records and parsing them as the worker does."""

from __future__ import annotations

from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, Rejection, Request, Schedule, parse_record
from ktimers.config import IngressFormat, TopicsConfig

NOW_MS = 1_794_999_000_123
SENT_MS = 1_794_998_999_000  # the request record's timestamp
ETF1_TOPIC = "schedules"
COUNTDOWN_TOPIC = "delays"

CONFIG = ParseLimits(
    topics=TopicsConfig(
        ingress=((ETF1_TOPIC, IngressFormat.ETF1), (COUNTDOWN_TOPIC, IngressFormat.COUNTDOWN))
    ),
    allowed_callback_topics=("cb-*", "online-videos", "T"),
    # A stored timer with its table key, headers and all, must fit (etf1's carry ~200 bytes).
    max_payload_bytes=1000,
    max_due_ahead_s=400 * 86400,
)

Headers = tuple[tuple[str, bytes | None], ...]


def record(
    topic: str,
    value: bytes | None,
    key: bytes | None = None,
    *,
    headers: Headers = (),
    partition: int = 2,
    offset: int = 17,
    timestamp_ms: int = SENT_MS,
) -> SourceRecord:
    return SourceRecord(topic, partition, offset, key, value, headers, timestamp_ms)


def parse(rec: SourceRecord, config: ParseLimits = CONFIG) -> list[Request]:
    return parse_record(rec, config, NOW_MS)


def one(rec: SourceRecord, config: ParseLimits = CONFIG) -> Request:
    requests = parse(rec, config)
    assert len(requests) == 1, requests
    return requests[0]


def scheduled(rec: SourceRecord, config: ParseLimits = CONFIG) -> Schedule:
    result = one(rec, config)
    assert isinstance(result, Schedule), result
    return result


def rejected(rec: SourceRecord, config: ParseLimits = CONFIG) -> Rejection:
    result = one(rec, config)
    assert isinstance(result, Rejection), result
    return result


def cancelled(rec: SourceRecord, config: ParseLimits = CONFIG) -> CancelRequest:
    result = one(rec, config)
    assert isinstance(result, CancelRequest), result
    return result


def headers_of(schedule: Schedule) -> list[tuple[str, bytes]]:
    return [(h.key, h.value) for h in schedule.timer.future.headers]
