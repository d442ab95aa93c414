"""Prometheus metrics of the futures worker (served at ``/metrics``)."""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString
from rocksdict import DbClosedError

from futures.worker.destinations import MAX_TOPICS
from futures.worker.table import MEMTABLES, PartitionTimers

# Lateness buckets (seconds): sub-second resolution matters to users of precise
# timers, minutes matter after an outage.
LATENESS_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    3600.0,
)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scheduled = Counter("timers_scheduled_total", "Timers accepted into the table", registry=r)
        self.fired = Counter("timers_fired_total", "Callbacks delivered", registry=r)
        self.cancelled = Counter("timers_cancelled_total", "Timers removed by a cancel request", registry=r)
        self.cancel_missed = Counter(
            "timers_cancel_missed_total", "Cancel requests that found nothing pending", registry=r
        )
        self.rejected = Counter(
            "timers_rejected_total", "Requests or callbacks dead-lettered or dropped", ["reason"], registry=r
        )
        self.lateness = PieceHistogram(
            "timers_fire_lateness_seconds", "Fire time minus due time", LATENESS_BUCKETS, registry=r
        )
        self.requests_skipped = Counter(
            "timers_requests_skipped_total",
            "Request records read again after a restart or rebalance, already applied, skipped",
            registry=r,
        )
        self.requests_read_back = Counter(
            "timers_requests_read_back_total",
            "Request records the stream skipped (a rebalance) that the engine read back and applied",
            registry=r,
        )
        self.request_gaps = Counter(
            "timers_request_gaps_total",
            "Holes in the request offsets a worker was handed: read back from the broker (read-back), "
            "or read past by its consumer, holding no request (no-request: transaction markers, "
            "aborted transactions)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("read-back", "no-request"):
            self.request_gaps.labels(outcome)  # exported from the start, at 0
        self.restated = Counter(
            "timers_changelog_restated_total",
            "Changelog keys written again because an owner revoked before wrote them late "
            "(futures/worker/restate.py)",
            registry=r,
        )
        self.ticks = Counter(
            "timers_ticks_total",
            "Ticks by outcome: advanced the watermark, duplicate/old (no-op), "
            "ahead of the worker clock by more than the tolerance (refused), invalid",
            ["outcome"],
            registry=r,
        )
        self.join_wait = PieceHistogram(
            "timers_join_wait_seconds",
            "How long a tick waited for older requests of its partition before it fired",
            LATENESS_BUCKETS,
            registry=r,
        )
        self.join_wait_bound = Counter(
            "timers_join_wait_bound_total",
            "Ticks that fired after TIMERS_JOIN_MAX_WAIT_S without the older requests of their partition",
            registry=r,
        )
        self.dispatch_retries = Counter(
            "timers_dispatch_transient_failures_total",
            "Callbacks kept for the next tick after a transient delivery error",
            registry=r,
        )

    def timers_handled(self) -> float:
        """Timers accepted and fired since the worker started."""
        return sum(sample.value for counter in (self.scheduled, self.fired) for sample in _totals(counter))

    def watch_tables(self, partitions: Callable[[], Mapping[int, PartitionTimers]]) -> None:
        """Export pending count, watermark and table sizes of the partitions this worker holds."""
        self.registry.register(_TableCollector(partitions))

    def watch_callback_topics(self, forgotten: Callable[[], int]) -> None:
        """Export how many callback topics the worker forgot to stay within its bound
        (``CallbackTopics.forgotten``): a timer of a forgotten topic waits a tick more for a lookup."""
        self.registry.register(
            _Count(
                "timers_callback_topics_forgotten",
                f"Callback topics forgotten to keep at most {MAX_TOPICS:,} in memory (looked up again)",
                forgotten,
            )
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class PieceHistogram(Collector):
    """A Prometheus histogram that takes a whole piece's observations in one call.

    ``prometheus_client.Histogram.observe`` takes a lock and updates two counters per
    value (docs/PERFORMANCE.md#firing-a-timer); the fire path observes every fired timer's lateness, so a
    piece is counted locally and merged once. Exposed exactly as a ``Histogram``
    with the same buckets (``_bucket{le}``, ``_sum``, ``_count``).
    """

    def __init__(
        self, name: str, documentation: str, buckets: Iterable[float], *, registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()  # observed on the event loop, collected by any scraper
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        # Sorted once, each bucket's count is then a bisection: no Python step per value
        # (a hot second observes 100,000).
        observed = list(values)
        ordered = sorted(observed)
        counts, below = [], 0
        for bound in self._bounds:
            upto = bisect_right(ordered, bound)  # le: value <= bound
            counts.append(upto - below)
            below = upto
        counts.append(len(ordered) - below)
        total = sum(observed, 0.0)  # in the order observed, as a Histogram adds them
        with self._lock:
            self._counts = [a + b for a, b in zip(self._counts, counts, strict=True)]
            self._sum += total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=total)


class _TableCollector(Collector):
    """Reads the tables at scrape time: the counts they keep are the truth, also right after recovery."""

    def __init__(self, partitions: Callable[[], Mapping[int, PartitionTimers]]) -> None:
        self._partitions = partitions

    def collect(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "timers_pending", "Pending timers held by this worker", labels=["partition"]
        )
        watermark = GaugeMetricFamily(
            "timers_watermark_seconds", "Epoch second up to which timers have fired", labels=["partition"]
        )
        sst = GaugeMetricFamily(
            "timers_table_sst_bytes", "SST files of the partition's RocksDB table", labels=["partition"]
        )
        memtables = GaugeMetricFamily(
            "timers_table_memtable_bytes", "Memtables of the partition's RocksDB table", labels=["partition"]
        )
        compaction = GaugeMetricFamily(
            "timers_table_compaction_pending_bytes",
            "Bytes RocksDB estimates the partition's table must compact",
            labels=["partition"],
        )
        for partition, table in sorted(self._partitions().items()):
            pending.add_metric([str(partition)], table.pending)
            if table.watermark >= 0:
                watermark.add_metric([str(partition)], table.watermark)
            try:
                sizes = table.sizes()
            except DbClosedError:
                continue  # revoked while this scrape ran
            sst.add_metric([str(partition)], sizes.sst)
            memtables.add_metric([str(partition)], sizes.memtables)
            compaction.add_metric([str(partition)], sizes.compaction_pending)
        waited = CounterMetricFamily(
            "timers_table_flush_wait_seconds",
            "Seconds table writes waited for memtables being flushed, the tables' memtables past their cap",
            value=MEMTABLES.waited_s,
        )
        yield from (pending, watermark, sst, memtables, compaction, waited)


class _Count(Collector):
    """A counter that another object keeps, read at scrape time."""

    def __init__(self, name: str, documentation: str, count: Callable[[], int]) -> None:
        self._name, self._documentation, self._count = name, documentation, count

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._count())


def _totals(counter: Counter) -> list[Sample]:
    samples = (sample for family in counter.collect() for sample in family.samples)
    return [sample for sample in samples if sample.name.endswith("_total")]
