"""Fire workloads, the same for both designs: a hot second, timers spread over a window,
and steady rates. Each gets a fresh callback topic and its own collector process.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.cluster import Broker
from bench.collector import Arrivals, Collector
from bench.results import Fire
from bench.stats import burst_rate, lateness, rate_series
from bench.workload import Scheduler, even_due_times, load, now_ms, steady


class System(Protocol):
    """A timer service under test, as the fire workloads need it."""

    name: str

    def scheduler(self) -> Scheduler: ...

    def accepted(self) -> int:
        """Timers accepted so far (a running count)."""
        ...

    def load_rate(self) -> float:
        """Timers per second it accepts when loaded in bulk (plans due times)."""
        ...

    def check(self) -> None:
        """Raise if a process of the system died."""
        ...


@dataclass
class FireContext:
    broker: Broker
    work_dir: Path
    tail_timeout_s: float
    #: Time between the planned end of a load and the first due time (seconds).
    margin_s: float = 2.0


def finish(
    system: str,
    workload: str,
    expected: int,
    arrivals: Arrivals,
    origin_ms: int,
    bucket_s: float,
) -> Fire:
    """The :class:`Fire` of ``system`` (its name) from what the receiver got: lateness, and the rate
    of arrivals in ``bucket_s`` buckets from ``origin_ms``."""
    late = lateness(expected, arrivals.due_ms, arrivals.fired_ms, arrivals.received_ms, arrivals.ids)
    t, series = rate_series(arrivals.received_ms, origin_ms, bucket_s)
    # For a hot second, how fast one second's timers went out; spread over a window,
    # the offered rate the system kept up with.
    rate = burst_rate(arrivals.received_ms)
    fire = Fire(system=system, workload=workload, timers=expected, fire_rate=rate, lateness=late)
    fire.series_t, fire.series_rate, fire.arrivals = t, series, arrivals
    if late.missing:
        fire.notes.append(f"{late.missing} of {expected} callbacks not received within the tail timeout")
    if late.early:
        fire.notes.append(f"{late.early} callbacks arrived before their due time")
    if late.repeats:
        fire.notes.append(f"{late.repeats} callbacks arrived again, of timers received before")
    return fire


def _collector(ctx: FireContext, system: System, workload: str, expected: int) -> Collector:
    topic = ctx.broker.create_topic(f"bench-cb-{workload}")
    return Collector(ctx.broker, topic, expected, ctx.work_dir / f"{system.name}-{workload}.npy")


def _wait_accepted(system: System, target: int, until: float) -> int:
    while system.accepted() < target and time.time() < until:
        system.check()
        time.sleep(0.1)
    return system.accepted()


def scheduled(
    ctx: FireContext,
    system: System,
    workload: str,
    count: int,
    window_s: float,
    bucket_s: float,
    firing: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
) -> Fire:
    """``count`` timers loaded first, then due evenly over ``window_s`` seconds.

    ``window_s <= 1`` is a hot second: every timer due within the one second that
    ends on a tick, so all of them fire on that tick. The first tick is planned so
    that loading (at the system's bulk rate) ends before it; if it did not, the
    result says so. ``firing`` is entered once the timers are accepted and left
    when the callbacks are in: a profile taken in it is the firing's, not the load's.
    """
    planned_load_s = count / max(system.load_rate(), 1.0)
    first_s = math.ceil(time.time() + planned_load_s * 1.5 + ctx.margin_s)
    if window_s <= 1.0:
        due = even_due_times(count, first_s * 1000 - 999, 0.999)
    else:
        due = even_due_times(count, first_s * 1000, window_s)
    last_due_s = due[-1] / 1000
    collector = _collector(ctx, system, workload, count)
    collector.start(deadline=last_due_s + ctx.tail_timeout_s)
    try:
        base = system.accepted()
        scheduler = system.scheduler()
        try:
            load(scheduler, collector.topic, due)
        finally:
            scheduler.close()
        got = _wait_accepted(system, base + count, until=first_s - 0.2)
        with firing():
            arrivals = collector.finish()
    finally:
        collector.stop()
    fire = finish(system.name, workload, count, arrivals, first_s * 1000, bucket_s)
    fire.window_s = window_s if window_s > 1.0 else 0.0
    if got < base + count:
        fire.notes.append(
            f"only {got - base} of {count} timers were accepted by their due time: firing overlapped loading"
        )
    return fire


def steady_rate(
    ctx: FireContext, system: System, workload: str, rate: int, duration_s: float, lead_s: float
) -> Fire:
    """Timers due at ``rate`` per second for ``duration_s`` seconds, requested ``lead_s`` ahead."""
    expected = int(rate * duration_s)
    origin_ms = now_ms() + int(lead_s * 1000)
    collector = _collector(ctx, system, workload, expected)
    collector.start(deadline=time.time() + lead_s + duration_s + ctx.tail_timeout_s)
    try:
        scheduler = system.scheduler()
        try:
            sent = steady(scheduler, collector.topic, rate, duration_s, lead_s, system.check)
        finally:
            scheduler.close()
        arrivals = collector.finish()
    finally:
        collector.stop()
    fire = finish(system.name, workload, expected, arrivals, origin_ms, 1.0)
    fire.window_s = duration_s
    if sent.max_send_lag_ms > 500:
        fire.notes.append(f"the load generator fell up to {sent.max_send_lag_ms} ms behind its send schedule")
    return fire
