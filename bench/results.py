"""What the benchmarks measured: plain dataclasses, kept in one file, ``docs/bench/results.json``.

The file holds the runs of ``make bench`` (``runs``) and the last run of each command measured
apart (``capacity``, ``jobs``, ``failover``); each command replaces its own part and leaves the
others. :mod:`bench.render` writes the Markdown from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.collector import Arrivals
from bench.stats import Lateness

OURS = "kafka-timers"
#: The Redis design without persistence (the fastest it can be) and with an append-only
#: file fsynced every second (the fair comparison for a durable service).
REDIS = "redis-zset"
REDIS_AOF = "redis-zset-aof"
REDIS_SYSTEMS = (REDIS, REDIS_AOF)
#: Callbacks produced on their due millisecond straight to the receiver's topic (:mod:`bench.direct`).
DIRECT = "direct produce"


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
class SustainedStep:
    """One rate tried by the sustained-rate search: its steady workload, and whether the rate held."""

    #: Timers scheduled (and due) per second.
    rate: int
    fire: Fire
    #: How much later the timers due at the end of the hold were than those due at its start
    #: (ms, from a line through each due second's median lateness): a backlog growing shows here.
    growth_ms: float
    #: Why the rate was not held; empty when it was.
    failed: str = ""


@dataclass
class Sustained:
    """The highest steady schedule rate one system held, and the rates tried to find it."""

    system: str
    #: Seconds each rate was held for.
    hold_s: float
    #: Lateness at the receiver that a held rate stays within, at its p99 (ms).
    p99_limit_ms: float
    steps: list[SustainedStep] = field(default_factory=list)

    @property
    def held(self) -> SustainedStep | None:
        """The highest rate held (None if none was)."""
        return max((s for s in self.steps if not s.failed), key=lambda s: s.rate, default=None)

    @property
    def not_held(self) -> SustainedStep | None:
        """The lowest rate above the one held that failed (None if none did)."""
        floor = self.held.rate if self.held else 0
        return min((s for s in self.steps if s.failed and s.rate > floor), key=lambda s: s.rate, default=None)


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
    #: Timers per second each Redis design accepts through pipelined ZADDs (its "ingest"),
    #: by system name; measured with as many timers as our batched ingest.
    zadd_rates: dict[str, float] = field(default_factory=dict)
    #: Steady workloads send each request this long before its due time (seconds).
    steady_lead_s: float = 0.0
    sustained: list[Sustained] = field(default_factory=list)
    profiles: list[ProfileSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def every_fire(self) -> list[Fire]:
        """Every fire workload of the run, the sustained search's steps included."""
        return [*self.fires, *(step.fire for s in self.sustained for step in s.steps)]

    def fire(self, system: str, workload: str) -> Fire | None:
        return next((f for f in self.fires if f.system == system and f.workload == workload), None)

    def capacity_of(self, system: str) -> Capacity | None:
        return next((c for c in self.capacity if c.system == system), None)

    def ingest_of(self, path: str) -> Ingest | None:
        return next((i for i in self.ingest if i.path == path), None)

    def sustained_of(self, system: str) -> Sustained | None:
        return next((s for s in self.sustained if s.system == system), None)


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


@dataclass
class CapacityStep:
    """One size of ``make bench-capacity``: the worker at ``pending`` timers, and its hot seconds."""

    pending: int
    load_s: float = 0.0
    #: The worker's resident memory at rest, once the hot seconds are swept (MB).
    rss_mb: float = 0.0
    #: Its highest resident memory during the hot seconds, sampled every 0.2 s (MB; 0 if not measured).
    peak_rss_mb: float = 0.0
    data_gb: float = 0.0
    broker_gb: float | None = None
    #: Compaction the worker's tables owed as the hot seconds began (GB; RocksDB's estimate).
    compaction_owed_gb: float | None = None
    #: Callbacks per second of each hot second at this size, and its last callback after due (ms).
    rates: list[float] = field(default_factory=list)
    last_ms: list[float] = field(default_factory=list)
    early: int = 0
    #: The 1/5/15-minute load average before → after the hot seconds.
    load_avg: str = ""


@dataclass
class CapacityRun:
    """One ``make bench-capacity``: what was run, where, and a :class:`CapacityStep` per size."""

    command: str
    when: str
    cores: int
    hot: int
    repeat: int
    steps: list[CapacityStep] = field(default_factory=list)

    def shares(self) -> list[float | None]:
        """Each size's hot-second rate (median) as a share of the size before's (None for the first)."""
        rates = [statistics.median(s.rates) if s.rates else 0.0 for s in self.steps]
        return [None, *(b / a if a else None for a, b in zip(rates, rates[1:], strict=False))]

    def shares_of_first(self) -> list[float | None]:
        """Each size's hot-second rate (median) as a share of the first size's (None for the first)."""
        rates = [statistics.median(s.rates) if s.rates else 0.0 for s in self.steps]
        return [None, *(rate / rates[0] if rates[0] else None for rate in rates[1:])]


@dataclass
class Job:
    """One compaction of ``make bench-jobs`` on one Spark master."""

    master: str
    rows: int
    seconds: float
    #: CPU seconds of the driver, the JVM and the Python workers together (not the broker's).
    cpu_s: float
    load_before: list[float]
    load_after: list[float]

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class JobsRun:
    """One ``make bench-jobs``: the request log written, then one compaction per master."""

    command: str
    when: str
    cores: int
    records: int
    partitions: int
    fill_s: float
    jobs: list[Job] = field(default_factory=list)


@dataclass
class FailoverKind:
    """The rounds of one kind (``takeover`` or ``restart``) of ``make failover``, in seconds."""

    kind: str
    rounds: int
    #: Kill to the last of its partitions firing again: median and worst over the rounds.
    all_back_s: float
    worst_s: float
    #: Kill to the first of its partitions firing again, median over the rounds.
    first_back_s: float


@dataclass
class FailoverStep:
    """When the worker taking over logged one step: seconds after the kill, over the rounds."""

    kind: str
    step: str
    #: None when some round's log did not show the step.
    median_s: float | None
    lo_s: float | None = None
    hi_s: float | None = None


@dataclass
class FailoverRun:
    """One ``make failover``."""

    command: str
    when: str
    broker: str
    partitions: int
    every_ms: float
    #: Group timeouts and membership, as the workers ran.
    settings: str
    load_before: str
    load_after: str
    cores: int
    kinds: list[FailoverKind] = field(default_factory=list)
    steps: list[FailoverStep] = field(default_factory=list)


def workload_title(fire: Fire) -> str:
    name = fire.workload
    if fire.system == DIRECT:
        per_s = name.rpartition("-")[2]
        return (
            f"direct produce: callbacks produced on their due millisecond, {int(per_s):,}/s for "
            f"{fire.window_s:g} s ({fire.timers:,})"
        )
    if name == "hot-second":
        return f"hot second ({fire.timers:,} timers due in one second)"
    if name == "precise-hot-second":
        return f"precise hot second ({fire.timers:,} timers due in one second)"
    if name == "capacity-hot":
        return f"hot second at capacity ({fire.timers:,} due)"
    if name == "spread":
        offered = f" = {fire.timers / fire.window_s:,.0f}/s" if fire.window_s else ""
        return f"spread ({fire.timers:,} timers over {fire.window_s:g} s{offered})"
    kind, _, per_s = name.partition("-")
    return f"{kind} {int(per_s):,}/s for {fire.window_s:g} s ({fire.timers:,} timers)"


def first_fire(runs: Sequence[Results], system: str, workload: str) -> Fire | None:
    return next((f for r in runs if (f := r.fire(system, workload)) is not None), None)


#: Where the results live, under the docs directory.
RESULTS_FILE = Path("bench") / "results.json"

D = TypeVar("D")


def read(docs: Path) -> dict[str, Any]:
    """Everything measured so far (an empty dict before the first measurement)."""
    path = docs / RESULTS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def store(docs: Path, part: str, value: Any) -> None:
    """Replace one part of the results file (``runs``, ``capacity``, ``jobs`` or ``failover``)."""
    results = read(docs)
    results[part] = plain(value)
    path = docs / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def build(cls: type[D], data: Mapping[str, Any], **lists: type) -> D:
    """A dataclass from its :func:`plain` form; keys it does not know are left out, null floats are NaN.
    ``lists``: fields that hold a list of dataclasses, and their class."""
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name in lists:
            values[name] = [build(lists[name], item) for item in value]
        elif name in known:
            values[name] = math.nan if value is None and known[name].type == "float" else value
    return cls(**values)


def _fire(data: Mapping[str, Any]) -> Fire:
    fire = build(Fire, data)
    fire.lateness = build(Lateness, data["lateness"])
    return fire


def load_runs(runs: list[Mapping[str, Any]]) -> list[Results]:
    """The ``runs`` part of the results file, as :class:`Results`."""
    loaded = []
    for data in runs:
        r = build(Results, data)
        r.ceiling = build(Throughput, data["ceiling"]) if data.get("ceiling") else None
        r.floor = build(Throughput, data["floor"]) if data.get("floor") else None
        r.ingest = [build(Ingest, i) for i in data.get("ingest", [])]
        r.fires = [_fire(f) for f in data.get("fires", [])]
        r.capacity = []
        for c in data.get("capacity", []):
            cap = build(Capacity, c)
            cap.hot = _fire(c["hot"]) if c.get("hot") else None
            r.capacity.append(cap)
        r.sustained = []
        for data_s in data.get("sustained", []):
            found = build(Sustained, data_s)
            found.steps = [
                SustainedStep(step["rate"], _fire(step["fire"]), step["growth_ms"], step.get("failed", ""))
                for step in data_s.get("steps", [])
            ]
            r.sustained.append(found)
        r.profiles = [
            ProfileSummary(
                p["phase"],
                p["samples"],
                [(fn, pct) for fn, pct in p.get("top_self", [])],
                [(fn, pct) for fn, pct in p.get("top_ours", [])],
                p.get("note", ""),
            )
            for p in data.get("profiles", [])
        ]
        loaded.append(r)
    return loaded
