"""The timers every measurement schedules, and the two ways to send them at a steady rate.

A timer is the same everywhere: a 100-byte payload, a short key, one callback topic.
:class:`Scheduler` is what both designs implement — kafka-timers through its
client library (:class:`ClientScheduler`), Redis through ZADD (``redis_baseline``) —
so the load generators below drive either one unchanged.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from futures.client import TimerClient, TimerSpec
from ktimers.config import CommonConfig
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, H_TOKEN

PAYLOAD_BYTES = 100
PAYLOAD = b"p" * PAYLOAD_BYTES
#: Timers handed to a scheduler per call when loading.
CHUNK = 5_000
#: The steady generator sends what became due for sending this often (seconds).
SLICE_S = 0.05

#: Timers that must never fire during a run: due a day ahead, over an hour.
FAR_AHEAD_MS = 86_400_000
FAR_WINDOW_S = 3600.0
#: Callback topic of timers that never fire (never created).
UNFIRED_TOPIC = "bench-unfired"

#: librdkafka settings of every load generator: big batches, so sending is never the bottleneck.
FAST_PRODUCER = {
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    # librdkafka's informational lines (queue purges on close) would clutter the progress output.
    "log_level": 4,
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def callback_key(index: int) -> str:
    return f"k-{index:010d}"


def callback_headers(due_ms: int, fired_ms: int) -> list[tuple[str, str | bytes | None]]:
    """The ``kt-*`` headers of a callback due at ``due_ms`` and sent at ``fired_ms``, with a new id."""
    return [
        (H_ID, uuid.uuid4().hex.encode()),
        (H_DUE_MS, str(due_ms).encode()),
        (H_TOKEN, b"t"),
        (H_FIRED_MS, str(fired_ms).encode()),
    ]


class Scheduler(Protocol):
    """Schedules timers with the standard payload; one implementation per design."""

    def schedule(self, topic: str, due_ms: Sequence[int], first_index: int) -> None:
        """One timer per due time (epoch ms), keys numbered from ``first_index``."""
        ...

    def flush(self) -> None:
        """Return once everything scheduled so far is accepted by the store."""
        ...

    def close(self) -> None: ...


class ClientScheduler:
    """kafka-timers through :class:`TimerClient`: one request record per timer, or batched
    records through ``schedule_many`` (``batched=True``)."""

    def __init__(self, common: CommonConfig, *, batched: bool) -> None:
        self.batched = batched
        self._client = TimerClient(common, producer_config=FAST_PRODUCER)

    def schedule(self, topic: str, due_ms: Sequence[int], first_index: int) -> None:
        if self.batched:
            self._schedule_many(topic, due_ms, first_index)
            return
        schedule = self._client.schedule
        for i, due in enumerate(due_ms):
            schedule(topic, callback_key(first_index + i), PAYLOAD, at=due / 1000)

    def _schedule_many(self, topic: str, due_ms: Sequence[int], first_index: int) -> None:
        timers = [
            TimerSpec(topic, callback_key(first_index + i), PAYLOAD, at=due / 1000)
            for i, due in enumerate(due_ms)
        ]
        self._client.schedule_many(timers)

    def flush(self) -> None:
        self._client.flush(timeout=120)

    def close(self) -> None:
        self._client.close(timeout=120)


def load(scheduler: Scheduler, topic: str, due_ms: Sequence[int], first_index: int = 0) -> float:
    """Schedule every timer as fast as the scheduler takes them; return the seconds it took."""
    started = time.monotonic()
    for start in range(0, len(due_ms), CHUNK):
        scheduler.schedule(topic, due_ms[start : start + CHUNK], first_index + start)
    scheduler.flush()
    return time.monotonic() - started


def far_future(count: int) -> list[int]:
    """Due times of timers that must not fire during a run: a day ahead, spread over an hour."""
    return even_due_times(count, now_ms() + FAR_AHEAD_MS, FAR_WINDOW_S)


def even_due_times(count: int, first_ms: int, window_s: float) -> list[int]:
    """``count`` due times spread evenly over ``window_s`` seconds from ``first_ms``."""
    step = window_s * 1000 / max(count, 1)
    return [first_ms + int(i * step) for i in range(count)]


@dataclass(frozen=True)
class SteadyLoad:
    """What a steady generator sent: the due times, and how far behind schedule it fell."""

    due_ms: list[int]
    #: Longest delay of a request past its planned send time (ms): a generator that
    #: cannot keep up shows here, not as the service's lateness.
    max_send_lag_ms: int


def steady(
    scheduler: Scheduler, topic: str, rate: int, duration_s: float, lead_s: float, check: Callable[[], None]
) -> SteadyLoad:
    """Timers due at ``rate`` per second for ``duration_s``, each requested ``lead_s`` before it is due.

    The first is due ``lead_s`` from now; requests go out every :data:`SLICE_S`, so
    the service ingests and fires at the same time, as it does in production.
    ``check`` runs every slice (it raises when a service died).
    """
    start_ms = now_ms()
    lead_ms = int(lead_s * 1000)
    due = even_due_times(int(rate * duration_s), start_ms + lead_ms, duration_s)
    sent = 0
    max_lag = 0
    while sent < len(due):
        now = now_ms()
        upto = sent
        while upto < len(due) and due[upto] - lead_ms <= now:
            upto += 1
        if upto > sent:
            max_lag = max(max_lag, now - (due[sent] - lead_ms))
            scheduler.schedule(topic, due[sent:upto], sent)
            sent = upto
        check()
        time.sleep(SLICE_S)
    scheduler.flush()
    return SteadyLoad(due, max_lag)
