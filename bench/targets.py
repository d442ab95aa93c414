"""The service's performance targets, checked against the runs' figures (the median over the runs,
or the worst run for a target that must hold in every run).

Per worker process, ratios from the same run. A target whose measurement this run
did not make (a profile without 10 M pending, a measurement that failed) is "not
measured", with what was measured instead where there is something to show.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.aggregate import (
    Format,
    Getter,
    Spread,
    ceiling_rate,
    held_rate,
    of_fire,
    percent,
    rate,
    ratio,
    spread,
)
from bench.results import OURS, REDIS, Capacity, CapacityRun, Fire, Results
from bench.sustained import P99_LIMIT_MS

MET, MISSED, NOT_MEASURED = "met", "missed", "not measured"

#: Capacity targets are for this many pending timers (``make bench-full``).
CAPACITY_TARGET = 10_000_000
#: Fire throughput at 10 M pending counts as "as fast as with 1 M" within this share.
SAME_SPEED = 0.9


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    status: str
    #: How far off, for a missed target ("short by 12 %" or "over by 340 ms").
    gap: str = ""
    #: The profiled phase that shows where the time went.
    phase: str = ""
    #: The section of docs/PERFORMANCE.md about it.
    see: str = ""


@dataclass(frozen=True)
class Target:
    name: str
    get: Getter
    limit: float
    #: True: the figure must be at least ``limit``; False: at most.
    at_least: bool
    fmt: Format
    phase: str = ""
    #: Why the runs could not measure it, and what they measured instead (None: they could).
    unmeasured: Callable[[Sequence[Results]], str | None] | None = None
    #: The section of docs/PERFORMANCE.md about it.
    see: str = ""
    #: Judged by the worst run, not the median.
    every_run: bool = False

    def check(self, runs: Sequence[Results]) -> Verdict:
        why = self.unmeasured(runs) if self.unmeasured else None
        values: Spread = spread(runs, self.get)
        if why is not None or not values.known:
            return Verdict(self.name, why or "—", NOT_MEASURED, phase=self.phase, see=self.see)
        measured = values.show(self.fmt)
        value = values.median
        if self.every_run:
            value = values.lo if self.at_least else values.hi
            if values.lo != values.hi:
                measured += f", worst {self.fmt(value)}"
        if (value >= self.limit) if self.at_least else (value <= self.limit):
            return Verdict(self.name, measured, MET, phase=self.phase, see=self.see)
        if self.at_least:
            gap = short_by(value, self.limit)
        else:
            gap = f"over by {self.fmt(value - self.limit)}"
        return Verdict(self.name, measured, MISSED, gap, self.phase, self.see)


def short_by(value: float, limit: float) -> str:
    """How far ``value`` falls short of ``limit``, in percent of it: whole percents, or a tenth
    below 1 % (a miss never reads "short by 0 %")."""
    gap = 100 * (1 - value / limit)
    return f"short by {gap:.0f} %" if gap >= 0.95 else f"short by {max(gap, 0.1):.1f} %"


#: The sections of docs/PERFORMANCE.md that say where a target's time goes and what would close it.
FIRING, ACCEPTING, LATENESS, PENDING = "firing-a-timer", "accepting-a-timer", "lateness", "10-m-pending"
SUSTAINING = "sustaining-a-rate"


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if abs(value) >= 100 else f"{value:,.1f} ms"


def _mb(value: float) -> str:
    return f"{value:,.0f} MB"


def _size(runs: Sequence[Results], key: str) -> float:
    value = runs[0].sizes.get(key, 0) if runs else 0
    return value if isinstance(value, int | float) else 0


def _below_capacity_target(
    shown: Getter, fmt: Format, what: str
) -> Callable[[Sequence[Results]], str | None]:
    """Not measured when the runs had fewer than 10 M pending; says what they measured at their size."""

    def why(runs: Sequence[Results]) -> str | None:
        caps = [c for c in (r.capacity_of(OURS) for r in runs) if c is not None]
        if not caps or min(c.pending for c in caps) >= CAPACITY_TARGET:
            return None
        value = spread(runs, shown).show(fmt)
        where = "`make bench-capacity` or `make bench-full`"
        return f"{value} {what} at {caps[0].pending:,} pending; the target is for 10 M ({where})"

    return why


def _rss_peak_mb(r: Results) -> float | None:
    cap = r.capacity_of(OURS)
    return cap.rss_peak / 1e6 if cap else None


def _zadd_rate(r: Results) -> float | None:
    return r.zadd_rates.get(REDIS)


def _capacity_hot_share(r: Results) -> float | None:
    cap: Capacity | None = r.capacity_of(OURS)
    hot = r.fire(OURS, "hot-second")
    if cap is None or cap.hot is None or hot is None or not hot.fire_rate:
        return None
    return cap.hot.fire_rate / hot.fire_rate


def targets(runs: Sequence[Results]) -> list[Target]:
    hot = f"{_size(runs, 'hot_timers'):,}"
    hold = next((s.hold_s for r in runs for s in r.sustained), _size(runs, "sustained_hold_s"))
    held_for = f"held {hold:g} s, " if hold else ""
    hot_rate = of_fire(OURS, "hot-second", lambda f: f.fire_rate)
    precise = [
        Target(
            f"Precise mode, {title}: p99 at the receiver ≤ 10 ms in every run",
            of_fire(OURS, workload, lambda f: f.lateness.p99_ms),
            10,
            False,
            _ms,
            workload,
            see=LATENESS,
            every_run=True,
        )
        for workload, title in (
            ("precise-10000", "steady 10 k/s"),
            ("precise-hot-second", f"hot second of {hot}"),
        )
    ]

    def ingest(path: str) -> Getter:
        def get(r: Results) -> float | None:
            ing = r.ingest_of(path)
            return ing.rate if ing and ing.rate else None

        return get

    return [
        Target(
            f"Fire, hot second of {hot}: ≥ 100 % of the Redis poller's rate (in-memory Redis, same run)",
            ratio(hot_rate, of_fire(REDIS, "hot-second", lambda f: f.fire_rate)),
            1.0,
            True,
            percent,
            "hot-second",
            see=FIRING,
        ),
        Target(
            f"Fire, hot second of {hot}: ≥ 80 % of the pass-through ceiling (same run)",
            ratio(hot_rate, ceiling_rate),
            0.8,
            True,
            percent,
            "hot-second",
            see=FIRING,
        ),
        Target(
            f"Hot second of {hot}: last callback ≤ 1.5 s after due",
            of_fire(OURS, "hot-second", lambda f: f.lateness.max_ms),
            1500,
            False,
            _ms,
            "hot-second",
            see=FIRING,
        ),
        Target(
            "Lateness p99, steady 10 k/s, second mode ≤ 1.05 s",
            of_fire(OURS, "steady-10000", lambda f: f.lateness.p99_ms),
            1050,
            False,
            _ms,
            "steady-10000",
            see=LATENESS,
        ),
        *precise,
        Target(
            f"Sustained rate ({held_for}p99 at the receiver ≤ {P99_LIMIT_MS / 1000:g} s, second mode): "
            "≥ 100 % of the in-memory Redis design's (same run)",
            ratio(held_rate(OURS), held_rate(REDIS)),
            1.0,
            True,
            percent,
            "sustained",
            see=SUSTAINING,
        ),
        Target(
            "Ingest, one `Future` per record ≥ 100 k/s",
            ingest("single"),
            100_000,
            True,
            rate,
            "ingest-single",
            see=ACCEPTING,
        ),
        Target(
            "Ingest, batched records ≥ 100 % of the in-memory Redis design's pipelined ZADD (same run)",
            ratio(ingest("batched"), _zadd_rate),
            1.0,
            True,
            percent,
            "ingest-batched",
            see=ACCEPTING,
        ),
        Target(
            "10 M pending: worker RSS ≤ 300 MB",
            _rss_peak_mb,
            300,
            False,
            _mb,
            "capacity-load",
            _below_capacity_target(_rss_peak_mb, _mb, "peak"),
            PENDING,
        ),
        Target(
            "10 M pending: fire rate within 10 % of the rate at 0 pending",
            _capacity_hot_share,
            SAME_SPEED,
            True,
            percent,
            "capacity-hot",
            _below_capacity_target(_capacity_hot_share, percent, "of the hot second's rate"),
            PENDING,
        ),
    ]


def _our_fires(runs: Sequence[Results]) -> list[Fire]:
    return [f for r in runs for f in r.every_fire() if f.system == OURS]


def never_early(runs: Sequence[Results]) -> Verdict:
    fires = _our_fires(runs)
    early = sum(f.lateness.early for f in fires)
    status = NOT_MEASURED if not fires else (MET if early == 0 else MISSED)
    received = sum(f.lateness.received for f in fires)
    return Verdict(
        "Never early (every workload, both modes, every run)", f"{early} early of {received:,}", status
    )


def never_twice(runs: Sequence[Results]) -> Verdict:
    """No worker crashes in a bench run, so no timer may fire twice (at least once, not more)."""
    fires = [f for f in _our_fires(runs) if f.lateness.repeats is not None]
    repeats = sum(f.lateness.repeats or 0 for f in fires)
    status = NOT_MEASURED if not fires else (MET if repeats == 0 else MISSED)
    received = sum(f.lateness.received for f in fires)
    return Verdict(
        "Once: no callback received twice (no worker crashes in these runs)",
        f"{repeats} repeats of {received:,}",
        status,
        "a defect: the *repeats* column of the lateness tables says where" if repeats else "",
    )


@dataclass(frozen=True)
class _Size:
    """One size of a `make bench-capacity` run, as the 10 M targets read it."""

    pending: int
    #: The worker's highest RSS while it fired the size's hot seconds (its RSS after them, in
    #: runs that did not sample the peak): what it holds, the fire budget's bytes included.
    rss_mb: float
    #: The hot second's rate as a share of the first, smallest size's (None for the first size).
    vs_first: float | None
    when: str
    #: Whether ``rss_mb`` is the peak.
    peak: bool = False


#: The 10 M targets and how a `make bench-capacity` size shows them: (figure, limit, at least?, format).
_CAPACITY_TARGETS: dict[str, tuple[Callable[[_Size], float | None], float, bool, Format]] = {
    "capacity-load": (lambda size: size.rss_mb, 300, False, _mb),
    "capacity-hot": (lambda size: size.vs_first, SAME_SPEED, True, percent),
}


def _from_capacity_run(verdict: Verdict, size: _Size) -> Verdict:
    """A 10 M target these runs could not measure, judged by `make bench-capacity`."""
    get, limit, at_least, fmt = _CAPACITY_TARGETS[verdict.phase]
    value = get(size)
    if value is None:
        return verdict
    what = " at its peak, firing," if verdict.phase == "capacity-load" and size.peak else ""
    measured = f"{fmt(value)}{what} at {size.pending:,} pending (`make bench-capacity`, {size.when})"
    if (value >= limit) if at_least else (value <= limit):
        return Verdict(verdict.target, measured, MET, phase=verdict.phase, see=verdict.see)
    gap = short_by(value, limit) if at_least else f"over by {fmt(value - limit)}"
    return Verdict(verdict.target, measured, MISSED, gap, verdict.phase, verdict.see)


def evaluate(runs: Sequence[Results], capacity: CapacityRun | None = None) -> list[Verdict]:
    """Every target's verdict; ``capacity``: the last `make bench-capacity`, for the 10 M targets
    when these runs loaded fewer timers."""
    verdicts = [t.check(runs) for t in targets(runs)] + [never_early(runs), never_twice(runs)]
    sizes = []
    if capacity is not None:
        sizes = [
            _Size(step.pending, step.peak_rss_mb or step.rss_mb, share, capacity.when, bool(step.peak_rss_mb))
            for step, share in zip(capacity.steps, capacity.shares_of_first(), strict=True)
        ]
    largest = max((s for s in sizes if s.pending >= CAPACITY_TARGET), key=lambda s: s.pending, default=None)
    if largest is None:
        return verdicts
    return [
        _from_capacity_run(v, largest) if v.status == NOT_MEASURED and v.phase in _CAPACITY_TARGETS else v
        for v in verdicts
    ]
