"""Client library: schedule and cancel durable timers from any Python service.

Needs only confluent-kafka and protobuf (``pip install kafka-timers``; never Faust).
A timer is one ``Future`` record on the request topic, keyed by the timer id so
that a cancel or a reschedule by the same id lands in the same partition as the
timer it names::

    with TimerClient() as timers:
        handle = timers.schedule("orders", "order-42", b"remind", delay=3600)
        ...
        timers.cancel(handle)

Times: ``at`` and ``delay`` are in **seconds** (or ``datetime``/``timedelta``);
everything on the wire and in :class:`TimerHandle` is epoch **milliseconds**.

Modules: :mod:`~futures.client.records` builds request records (no I/O),
:mod:`~futures.client.sync` and :mod:`~futures.client.aio` send them,
:mod:`~futures.client.guard` drops superseded callbacks on the receiving side,
:mod:`~futures.client.partitioner` picks partitions as librdkafka does.
"""

from futures.client.aio import AsyncTimerClient
from futures.client.core import producer_config_for
from futures.client.records import (
    CallbackOptions,
    Clock,
    HeadersArg,
    ScheduleOptions,
    TimerHandle,
    TimerRecord,
    TimerSpec,
    When,
    build_batches,
    build_cancel,
    build_schedule,
    due_ms_for,
)
from futures.client.sync import TimerClient
from ktimers.producer import ProducerLike

__all__ = [
    "AsyncTimerClient",
    "CallbackOptions",
    "Clock",
    "HeadersArg",
    "ProducerLike",
    "ScheduleOptions",
    "TimerClient",
    "TimerHandle",
    "TimerRecord",
    "TimerSpec",
    "When",
    "build_batches",
    "build_cancel",
    "build_schedule",
    "due_ms_for",
    "producer_config_for",
]
