"""What a run measured: plain dataclasses, saved as ``results.json`` next to the report."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.collector import Arrivals
from bench.stats import Lateness

OURS = "kafka-timers"
#: The Redis design without persistence (the fastest it can be) and with an append-only
#: file fsynced every second (the fair comparison for a durable service).
REDIS = "redis-zset"
REDIS_AOF = "redis-zset-aof"
REDIS_SYSTEMS = (REDIS, REDIS_AOF)


@dataclass
class Throughput:
    """A rate measured as a backlog drained (or a pass-through), per second."""

    name: str
    count: int
    rate: float
    seconds: float
    detail: str = ""


@dataclass
class Ingest:
    """Timers accepted into the table per second, through one request path."""

    path: str  # "single" (one Future per record) or "batched"
    available: bool
    timers: int = 0
    rate: float = 0.0
    note: str = ""


@dataclass
class Fire:
    """One fire workload of one system, as its callback receiver saw it."""

    system: str
    #: e.g. "hot-second", "spread", "steady-1000", "precise-10000", "precise-hot-second", "capacity-hot"
    workload: str
    timers: int
    #: Callbacks per second: from the first to the last received (hot second), or the
    #: offered rate the receiver kept up with (spread, steady).
    fire_rate: float
    lateness: Lateness
    #: Seconds the due times were spread over (0: a hot second).
    window_s: float = 0.0
    #: Arrivals per second over time: seconds since the first due time, and rate.
    series_t: list[float] = field(default_factory=list)
    series_rate: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Raw arrivals, for the plots; not saved.
    arrivals: Arrivals | None = field(default=None, repr=False, compare=False)


@dataclass
class Capacity:
    """Memory and disk with many timers pending, and fire throughput at that size."""

    system: str
    pending: int
    #: Memory of the process(es) that hold the timers (bytes): before loading, at the
    #: highest sample while loading, after. For Redis also ``used_memory`` (INFO memory).
    rss_before: int
    rss_peak: int
    rss_after: int
    disk_bytes: int
    load_seconds: float
    used_memory_delta: int | None = None
    broker_rss_delta: int | None = None
    hot: Fire | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def memory_per_timer(self) -> float:
        """Bytes of memory each pending timer costs (Redis: ``used_memory`` growth)."""
        grown = (
            self.used_memory_delta if self.used_memory_delta is not None else self.rss_after - self.rss_before
        )
        return grown / self.pending if self.pending else float("nan")

    @property
    def disk_per_timer(self) -> float:
        return self.disk_bytes / self.pending if self.pending else float("nan")


@dataclass
class ProfileSummary:
    """Where the worker spent its CPU during one measurement (py-spy samples)."""

    phase: str
    samples: int
    #: (function (file:line), share of samples in it, in percent), most first.
    top_self: list[tuple[str, float]] = field(default_factory=list)
    #: Our own functions (futures/, ktimers/) by share of samples they are on the stack of.
    top_ours: list[tuple[str, float]] = field(default_factory=list)
    note: str = ""


@dataclass
class Results:
    profile: str
    started: str
    duration_s: float = 0.0
    machine: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    broker: str = ""
    command: str = ""
    #: The profile's sizes (see bench/profiles.py).
    sizes: dict[str, object] = field(default_factory=dict)
    ceiling: Throughput | None = None
    floor: Throughput | None = None
    ingest: list[Ingest] = field(default_factory=list)
    fires: list[Fire] = field(default_factory=list)
    capacity: list[Capacity] = field(default_factory=list)
    precise_available: bool = False
    #: Timers per second each Redis design accepts through pipelined ZADDs (its "ingest"),
    #: by system name; measured with as many timers as our batched ingest.
    zadd_rates: dict[str, float] = field(default_factory=dict)
    #: Steady workloads send each request this long before its due time (seconds).
    steady_lead_s: float = 0.0
    profiles: list[ProfileSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def fire(self, system: str, workload: str) -> Fire | None:
        return next((f for f in self.fires if f.system == system and f.workload == workload), None)

    def capacity_of(self, system: str) -> Capacity | None:
        return next((c for c in self.capacity if c.system == system), None)

    def ingest_of(self, path: str) -> Ingest | None:
        return next((i for i in self.ingest if i.path == path), None)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(plain(self), indent=2, default=str) + "\n")


def plain(obj: Any) -> Any:
    """JSON-ready copy of results: dataclasses as dicts, NaN as null, raw arrivals left out."""
    if isinstance(obj, Arrivals):
        return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "arrivals"}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj != obj:  # NaN is not JSON
        return None
    return obj
