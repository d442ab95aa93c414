"""kafka-timers itself: ingest through both request paths, fire workloads, capacity.

The worker and one oscillator run as child processes on the run's broker with
their default settings (``bench.cluster.ServiceStack``). Ingest is a backlog
drained: the requests are sent as fast as the client sends them, and the rate is
read from the worker's ``timers_scheduled_total`` while it rises. Memory is the
resident size of the worker process tree; disk, its data directory.
"""

from __future__ import annotations

import time

from bench.cluster import Broker, ServiceStack
from bench.fire import FireContext, scheduled
from bench.profiling import Profiler
from bench.results import OURS, Capacity, Ingest
from bench.sampler import Sampler
from bench.stats import rise_rate
from bench.workload import UNFIRED_TOPIC, ClientScheduler, Scheduler, far_future, load

SAMPLE_S = 0.2


class KafkaTimers:
    """The service under test, for the fire workloads (:class:`bench.fire.System`)."""

    name = OURS

    def __init__(self, stack: ServiceStack, *, batched: bool, load_rate: float) -> None:
        self.stack = stack
        self.batched = batched
        self._load_rate = load_rate

    def scheduler(self) -> Scheduler:
        return ClientScheduler(self.stack.common, batched=self.batched)

    def accepted(self) -> int:
        return int(self.stack.metric_sum("timers_scheduled_total"))

    def load_rate(self) -> float:
        return self._load_rate

    def check(self) -> None:
        self.stack.check()


def ingest(stack: ServiceStack, *, batched: bool, count: int, profiler: Profiler) -> Ingest:
    """Timers per second the worker accepts when ``count`` requests wait for it."""
    path = "batched" if batched else "single"
    base = stack.metric_sum("timers_scheduled_total")
    target = base + count
    read = lambda: stack.metric_sum("timers_scheduled_total")  # noqa: E731
    with (
        profiler.sample(stack.worker_pid, f"ingest-{path}"),
        Sampler(read, SAMPLE_S, until=target, timeout_s=max(120.0, count / 500)) as sampler,
    ):
        scheduler = ClientScheduler(stack.common, batched=batched)
        try:
            load(scheduler, UNFIRED_TOPIC, far_future(count))
        finally:
            scheduler.close()
        sampler.wait()
    stack.check()
    if sampler.last < target:
        return Ingest(path, timers=count, note=f"only {sampler.last - base:.0f} accepted in time")
    return Ingest(path, timers=count, rate=rise_rate(sampler.samples, base, target))


def capacity(
    stack: ServiceStack,
    system: KafkaTimers,
    broker: Broker,
    ctx: FireContext,
    profiler: Profiler,
    *,
    pending: int,
    hot: int,
    single_budget_s: float,
) -> Capacity:
    """Memory and disk with ``pending`` timers pending, then a hot second of ``hot`` of them."""
    notes = []
    if not system.batched:
        fits = int(system.load_rate() * single_budget_s)
        if fits < pending:
            notes.append(
                f"scaled down from {pending:,} to {fits:,} pending timers: without batched requests, "
                f"single-timer records load at {system.load_rate():,.0f}/s"
            )
            pending = fits
    rss_before, disk_before = stack.worker_rss_bytes(), stack.data_bytes()
    broker_before = broker.rss_bytes()
    base = stack.metric_sum("timers_pending")
    started = time.monotonic()
    with (
        profiler.sample(stack.worker_pid, "capacity-load"),
        Sampler(lambda: float(stack.worker_rss_bytes()), 0.5) as rss,
    ):
        scheduler = system.scheduler()
        try:
            load(scheduler, UNFIRED_TOPIC, far_future(pending))
        finally:
            scheduler.close()
        timeout = pending / max(system.load_rate(), 1.0) * 3 + 60
        reached = stack.wait_metric("timers_pending", base + pending, timeout)
    load_seconds = time.monotonic() - started
    if reached < base + pending:
        notes.append(f"only {reached - base:,.0f} of {pending:,} timers were pending after {timeout:.0f}s")
    rss_after = stack.worker_rss_bytes()
    broker_after = broker.rss_bytes()
    result = Capacity(
        system=OURS,
        pending=int(reached - base),
        rss_before=rss_before,
        rss_peak=int(max(rss.peak, rss_after)),
        rss_after=rss_after,
        disk_bytes=max(0, stack.data_bytes() - disk_before),
        load_seconds=load_seconds,
        broker_rss_delta=None
        if broker_after is None or broker_before is None
        else broker_after - broker_before,
        notes=notes,
    )
    firing = profiler.burst(stack.worker_pid, "capacity-hot")
    result.hot = scheduled(ctx, system, "capacity-hot", hot, 1.0, 0.1, firing=firing)
    return result
