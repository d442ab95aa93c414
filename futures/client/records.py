"""Timer request records, built without I/O: shared by the sync and asyncio clients.

Times: ``at`` and ``delay`` are in **seconds** (or ``datetime``/``timedelta``);
everything on the wire and in :class:`TimerHandle` is epoch **milliseconds**.
Callers that produce records themselves (e.g. inside their own Kafka
transaction) use :func:`build_schedule`, :func:`build_batches` and
:func:`build_cancel` directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack

from futures.client.partitioner import PartitionFn
from futures.client.recurring import RecurrenceOptions, is_recurring, recurrence_for
from futures.client.request_wire import batch_values, random_id
from ktimers.config import CommonConfig
from ktimers.producer import RecordHeaders
from ktimers.wire import (
    IDS_HEADER,
    IDS_NEW,
    KIND_BATCH,
    KIND_CANCEL,
    KIND_FUTURE,
    KIND_HEADER,
    MAX_ID_BYTES,
    Cancel,
    Future,
    Header,
)

Clock = Callable[[], float]
"""Returns the current time in epoch seconds (``time.time``)."""

HeadersArg = Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]
Data = str | bytes
"""A record key or payload: bytes, or text sent as UTF-8."""
When = datetime | timedelta | float
"""``send_later``'s due time: an aware datetime or epoch seconds (absolute), or a timedelta (relative)."""

# The worker writes these on callback records; a user header with this prefix
# could spoof one (a fake kt-token would defeat a TokenGuard), so they are refused.
RESERVED_HEADER_PREFIX = "kt-"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: ``Future.due_ms`` is an int64.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MS = timedelta(milliseconds=1)


class DueOptions(TypedDict, total=False):
    """When a timer is due: exactly one of ``at`` and ``delay`` (see :class:`ScheduleOptions`)."""

    at: datetime | float | None
    delay: float | timedelta | None


class CallbackOptions(TypedDict, total=False):
    """Who a timer is and what its callback carries besides the payload (see :class:`ScheduleOptions`)."""

    id: str | None
    token: str | None
    headers: HeadersArg | None


class ScheduleOptions(DueOptions, CallbackOptions, RecurrenceOptions, total=False):
    """The keyword arguments of ``schedule``: when (exactly one of ``at``/``delay``), id, token, headers;
    for a recurring timer, ``cron`` and ``tz`` or ``every``, and ``until``, ``max_count``.

    ``at``: an aware datetime or epoch seconds; ``delay``: seconds >= 0 or a
    timedelta; ``id`` defaults to a random uuid4 hex (scheduling again with the
    same id replaces the pending timer); ``token`` is copied to the callback's
    ``kt-token`` header (see :mod:`futures.client.guard`); ``headers`` are added
    to the callback record, in order.

    A recurring timer fires again and again under its id until ``until``, ``max_count``
    or a cancel ends it (:class:`~futures.client.recurring.RecurrenceOptions`); ``at`` or
    ``delay`` are then optional: from when the series starts.
    """


@dataclass(frozen=True)
class TimerHandle:
    """A scheduled timer: everything needed to cancel it or recognise its callback.

    ``due_ms`` is epoch milliseconds. ``record_key`` is the key of the request
    record; a cancel must use the same one to reach the same partition.
    """

    id: str
    record_key: bytes
    due_ms: int
    callback_topic: str
    token: str | None = None

    @property
    def due(self) -> datetime:
        """The due time as an aware UTC datetime."""
        return _EPOCH + self.due_ms * _MS


@dataclass(frozen=True)
class TimerRecord:
    """One record for the request topic, for callers that produce it themselves
    (e.g. inside their own Kafka transaction)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: RecordHeaders
    #: Explicit partition (batches: the partition of every timer in it); None lets the partitioner pick.
    partition: int | None = None


@dataclass(frozen=True)
class TimerSpec:
    """One timer for :meth:`TimerClient.schedule_many`: the arguments of ``schedule``."""

    topic: str
    key: str | bytes
    payload: str | bytes
    at: datetime | float | None = None
    delay: float | timedelta | None = None
    id: str | None = None
    token: str | None = None
    headers: HeadersArg | None = None


def due_ms_for(*, at: datetime | float | None, delay: float | timedelta | None, now: float) -> int:
    """Epoch milliseconds of the due time from exactly one of ``at`` and ``delay``.

    ``at``: an aware ``datetime`` or epoch seconds. ``delay``: seconds or a
    ``timedelta``, at least 0, counted from ``now`` (epoch seconds). A due time in
    the past is allowed: the timer fires on the worker's next tick.
    """
    if (at is None) == (delay is None):
        raise ValueError(
            "give exactly one of at= (epoch seconds or an aware datetime) "
            "or delay= (seconds >= 0 or a timedelta)"
        )
    if at is not None:
        if isinstance(at, datetime):
            if at.tzinfo is None or at.utcoffset() is None:
                raise ValueError(
                    "at= is a naive datetime: give an aware one, e.g. datetime.now(timezone.utc)"
                )
            return (at - _EPOCH) // _MS
        return _due_ms(_finite_seconds("at", at) * 1000)
    assert delay is not None  # noqa: S101 - narrowed by the exactly-one check above
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else _finite_seconds("delay", delay)
    if seconds < 0:
        raise ValueError(f"delay={delay!r} is negative: a delay must be >= 0 seconds")
    return _due_ms((now + seconds) * 1000)


def _due_ms(ms: float) -> int:
    """``ms`` rounded, where the wire holds it (an int64), or a ValueError."""
    if not _INT64_MIN <= ms <= _INT64_MAX:
        raise ValueError(f"the due time ({ms} ms from the epoch) is outside a 64-bit count of ms")
    return round(ms)


# Types isinstance() takes as tuples: ``int | float`` would build a union at every call.
_NUMBERS = (int, float)
_BYTES = (bytes, bytearray, memoryview)


def _finite_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        raise ValueError(f"{name}={value!r}: expected a number of seconds")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a finite number of seconds")
    return float(value)


def _utf8(name: str, value: str | bytes) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, _BYTES):
        return bytes(value)
    raise ValueError(f"{name} must be str or bytes, not {type(value).__name__}")


def _text(name: str, value: str | bytes) -> str:
    """``value`` as a string field's text: text as it is (protobuf refuses what UTF-8 cannot
    encode), bytes decoded as UTF-8."""
    if isinstance(value, str):
        return value
    data = _utf8(name, value)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} must be UTF-8 text (the wire field is a string)") from exc


def _user_headers(headers: HeadersArg | None) -> list[Header]:
    if headers is None:
        return []
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in pairs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"header name {name!r} must be a non-empty str")
        if name.startswith(RESERVED_HEADER_PREFIX):
            raise ValueError(f"header {name!r}: names starting with {RESERVED_HEADER_PREFIX!r} are reserved")
        out.append(Header(key=name, value=_utf8(f"header {name!r}", value)))
    return out


def build_schedule(
    common: CommonConfig,
    topic: str,
    key: str | bytes,
    payload: str | bytes,
    *,
    now: float,
    **options: Unpack[ScheduleOptions],
) -> tuple[TimerRecord, TimerHandle]:
    """The request record for one timer, and its handle. ``now`` is epoch seconds.

    A timer without ``id`` gets a random one, drawn for it here: its record says so
    (``kt-ids: new``), and the worker does not look for an older version of it.
    """
    value, handle = _future(common, topic, key, payload, now=now, **options)
    headers = request_headers(KIND_FUTURE, new_ids=options.get("id") is None)
    # Positional: a frozen dataclass takes keywords at twice the cost.
    record = TimerRecord(common.topics.request, handle.record_key, value, headers)
    return record, handle


def request_headers(kind: bytes, *, new_ids: bool) -> RecordHeaders:
    """A request record's headers: its ``kt-kind``, and ``kt-ids: new`` where every id in it was
    drawn for it (``new_ids``)."""
    return [(KIND_HEADER, kind), (IDS_HEADER, IDS_NEW)] if new_ids else [(KIND_HEADER, kind)]


def _future(
    common: CommonConfig,
    topic: str,
    key: str | bytes,
    payload: str | bytes,
    *,
    now: float,
    at: datetime | float | None = None,
    delay: float | timedelta | None = None,
    id: str | None = None,
    token: str | None = None,
    headers: HeadersArg | None = None,
    cron: str | None = None,
    tz: str | None = None,
    every: float | timedelta | None = None,
    until: datetime | float | None = None,
    max_count: int | None = None,
) -> tuple[bytes, TimerHandle]:
    """A timer's serialized ``Future`` and its handle: the arguments checked, the id drawn."""
    if not isinstance(topic, str) or not topic:
        raise ValueError("topic must be the non-empty name of the topic the callback goes to")
    if topic in common.topics.own:
        raise ValueError(
            f"topic {topic!r} is one of the timer service's own topics: it cannot receive callbacks"
        )
    if id is not None and (not isinstance(id, str) or not id):
        raise ValueError("id must be a non-empty str (or None for a generated one)")
    if id is not None and len(id.encode(errors="surrogatepass")) > MAX_ID_BYTES:
        # The worker would dead-letter it (invalid-id): refuse it here, where the caller can act.
        raise ValueError(f"id is longer than {MAX_ID_BYTES} bytes (UTF-8): use a shorter id")
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError("token must be a non-empty str (or None)")
    recurrence = None
    if is_recurring(cron, every) or tz is not None or until is not None or max_count is not None:
        start = None if at is None and delay is None else due_ms_for(at=at, delay=delay, now=now)
        recurrence, first = recurrence_for(
            cron=cron,
            tz=tz,
            every=every,
            until=until,
            max_count=max_count,
            start_ms=start,
            now_ms=round(now * 1000),
            to_ms=lambda when: due_ms_for(at=when, delay=None, now=now),
        )
        due_ms = _due_ms(first)
    else:
        due_ms = due_ms_for(at=at, delay=delay, now=now)
    timer_id = id or random_id()
    record_key = timer_id.encode()
    # Headers and a recurrence, which few timers carry, are added apart (headers checked first).
    user_headers = None if headers is None else _user_headers(headers)
    future = Future(
        callBackTopic=topic, callBackKey=_text("key", key), callBack=_utf8("payload", payload),
        id=timer_id, due_ms=due_ms, token=token,
    )  # fmt: skip
    if user_headers:
        future.headers.extend(user_headers)
    if recurrence is not None:
        future.recurrence.CopyFrom(recurrence)
    value = future.SerializeToString()
    # Positional: a frozen dataclass takes keywords at twice the cost.
    handle = TimerHandle(timer_id, record_key, due_ms, topic, token)
    return value, handle


#: Timers per batch record by default, and the most bytes a batch record may
#: reach (under Kafka's default 1 MB message.max.bytes, with room for headers).
BATCH_SIZE = 1000
MAX_BATCH_BYTES = 900_000


def build_batches(
    common: CommonConfig,
    timers: Iterable[TimerSpec],
    *,
    partitions: int,
    partition_of: PartitionFn,
    now: float,
    batch_size: int = BATCH_SIZE,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> tuple[list[TimerRecord], list[TimerHandle]]:
    """``FutureBatch`` records for many timers, and their handles in the order given.

    Every timer goes in a batch for the partition its id would be produced to
    (``partition_of(id, partitions)``), so that a cancel or a replacement keyed
    by the id reaches the partition that holds it. The timers given no id, whose ids are
    drawn here, go in batches of their own, which say so (``kt-ids: new``: see
    :func:`build_schedule`). ``now`` is epoch seconds.
    """
    if batch_size < 1 or max_batch_bytes < 1:
        raise ValueError("batch_size and max_batch_bytes must be >= 1")
    handles: list[TimerHandle] = []
    # (partition, ids drawn here) → its timers' serialized Futures
    groups: dict[tuple[int, bool], list[bytes]] = {}
    for spec in timers:
        if not isinstance(spec, TimerSpec):
            raise ValueError(f"schedule_many takes TimerSpec items, not {type(spec).__name__}")
        value, handle = _future(
            common,
            spec.topic,
            spec.key,
            spec.payload,
            at=spec.at,
            delay=spec.delay,
            id=spec.id,
            token=spec.token,
            headers=spec.headers,
            now=now,
        )
        handles.append(handle)
        group = (partition_of(handle.record_key, partitions), spec.id is None)
        groups.setdefault(group, []).append(value)
    records = []
    for (partition, new_ids), futures in sorted(groups.items()):
        for value in batch_values(futures, batch_size, max_batch_bytes):
            records.append(
                TimerRecord(
                    topic=common.topics.request,
                    key=None,
                    value=value,
                    headers=request_headers(KIND_BATCH, new_ids=new_ids),
                    partition=partition,
                )
            )
    return records, handles


def due_for(when: When) -> DueOptions:
    """``send_later``'s ``when`` as ``schedule``'s keyword: ``at`` (absolute) or ``delay`` (relative)."""
    if isinstance(when, timedelta):
        return {"delay": when}
    if isinstance(when, datetime | int | float) and not isinstance(when, bool):
        return {"at": when}
    raise ValueError(
        f"when={when!r}: give an aware datetime or epoch seconds (absolute), or a timedelta (relative)"
    )


def build_cancel(
    common: CommonConfig, handle_or_id: TimerHandle | str, record_key: str | bytes | None
) -> tuple[TimerRecord, str]:
    """The cancel record for a timer, and the timer id it names."""
    if isinstance(handle_or_id, TimerHandle):
        timer_id, default_key = handle_or_id.id, handle_or_id.record_key
    elif isinstance(handle_or_id, str) and handle_or_id:
        timer_id, default_key = handle_or_id, handle_or_id.encode()
    else:
        raise ValueError("cancel() takes a TimerHandle or a non-empty timer id")
    key = default_key if record_key is None else _utf8("record_key", record_key)
    record = TimerRecord(
        topic=common.topics.request,
        key=key,
        value=Cancel(id=timer_id).SerializeToString(),
        headers=request_headers(KIND_CANCEL, new_ids=False),
    )
    return record, timer_id
