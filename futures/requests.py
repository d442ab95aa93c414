"""Turn a `timer-request` record into a schedule, a cancel, or a rejection with its reason.

Pure functions of (record, config, clock): no Kafka, no table. The engine
decides what a valid request does to the table; this module decides whether it
is valid and what it means.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from futures.config import WorkerConfig
from futures.records import SourceRecord
from ktimers.wire import (
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    Cancel,
    Future,
    StoredTimer,
    header_value,
    parse_second_key,
)

#: Longest timer id accepted (bytes): ids are part of every table key.
MAX_ID_BYTES = 512


@dataclass(frozen=True)
class Schedule:
    record: SourceRecord
    timer: StoredTimer

    @property
    def timer_id(self) -> str:
        return self.timer.future.id

    @property
    def due_ms(self) -> int:
        return self.timer.future.due_ms


@dataclass(frozen=True)
class CancelRequest:
    record: SourceRecord
    timer_id: str


@dataclass(frozen=True)
class Rejection:
    record: SourceRecord
    reason: str  # stable code, e.g. "undecodable"; documented in the README
    detail: str  # for humans
    timer_id: str = ""


Request = Schedule | CancelRequest | Rejection


def seed_id(record: SourceRecord) -> str:
    """Id of a request that carries none (seed producers): stable across re-reads of the record."""
    return f"seed-{record.partition}-{record.offset}"


def parse_request(record: SourceRecord, config: WorkerConfig, now_ms: int) -> Request:
    kind = header_value(record.headers, KIND_HEADER)
    if kind == KIND_CANCEL:
        return _parse_cancel(record)
    if kind not in (None, KIND_FUTURE):
        return Rejection(record, "unknown-kind", f"{KIND_HEADER}={kind!r}: expected 'future' or 'cancel'")
    return _parse_future(record, config, now_ms)


def _parse_cancel(record: SourceRecord) -> Request:
    try:
        cancel = Cancel.FromString(record.value or b"")
    except DecodeError as exc:
        return Rejection(record, "undecodable", f"not a Cancel message: {exc}")
    if not cancel.id:
        return Rejection(record, "missing-id", "a Cancel must name the timer id to cancel")
    return CancelRequest(record, cancel.id)


def _parse_future(record: SourceRecord, config: WorkerConfig, now_ms: int) -> Request:
    if record.value is None:
        return Rejection(record, "undecodable", "tombstone (null value) on the request topic")
    try:
        future = Future.FromString(record.value)
    except DecodeError as exc:
        return Rejection(record, "undecodable", f"not a Future message: {exc}")
    timer_id = future.id or seed_id(record)
    if len(timer_id.encode()) > MAX_ID_BYTES:
        return Rejection(record, "invalid-id", f"timer id longer than {MAX_ID_BYTES} bytes")
    if future.HasField("due_ms"):
        due_ms = future.due_ms
        if due_ms < 0:
            return Rejection(record, "bad-due-time", f"due_ms={due_ms} is negative", timer_id)
    else:
        second = parse_second_key(record.key)
        if second is None:
            return Rejection(
                record,
                "bad-due-time",
                f"no due_ms field and the key {record.key!r} is not an epoch second",
                timer_id,
            )
        due_ms = second * 1000
    problem = config.callback_topic_problem(future.callBackTopic)
    if problem is not None:
        return Rejection(record, problem[0], problem[1], timer_id)
    if len(future.callBack) > config.max_payload_bytes:
        return Rejection(
            record,
            "payload-too-large",
            f"callBack is {len(future.callBack)} bytes; the limit is {config.max_payload_bytes} "
            "(TIMERS_MAX_PAYLOAD_BYTES)",
            timer_id,
        )
    if config.max_due_ahead_s and due_ms > now_ms + config.max_due_ahead_s * 1000:
        return Rejection(
            record,
            "due-too-far",
            f"due {due_ms} is more than {config.max_due_ahead_s}s ahead (TIMERS_MAX_DUE_AHEAD_S)",
            timer_id,
        )
    future.id = timer_id
    future.due_ms = due_ms
    stored = StoredTimer(
        future=future, source_partition=record.partition, source_offset=record.offset, accepted_ms=now_ms
    )
    return Schedule(record, stored)
