"""One benchmark run: every measurement in order, on one broker; then the results are stored and rendered.

Order: the ceiling; then one service instance for ingest (single, the Faust floor on
the same records, batched) and the fire workloads; a fresh instance for capacity;
one in precise mode (a hot second, then the steady rates), and the same steady rates
produced straight to the receiver (``bench.direct``); then the Redis design with
the same workloads, without persistence and then durable (AOF, fsync every second:
its ingest, hot second and steady rates); last, the sustained rate of a fresh instance
and of the in-memory Redis design (``bench.sustained``). ``only`` picks some of these
phases (:data:`PHASES`). A measurement that fails is recorded in the
report and the run goes on. ``repeat`` runs all of it that many times, each on a fresh
broker; the report gives the median and the spread of every figure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from bench import ceiling, direct, faust_floor, plots, redis_baseline, service, sustained
from bench.cluster import PRECISE_ENV, Broker, open_broker, service_stack
from bench.fire import FireContext, System, scheduled, steady_rate
from bench.machine import machine, versions
from bench.profiles import Profile
from bench.profiling import Profiler
from bench.render import render
from bench.results import OURS, RESULTS_FILE, Fire, Results, Sustained, store
from bench.service import KafkaTimers
from bench.workload import CHUNK

T = TypeVar("T")

#: The phases of a run, in order (``--only`` picks some).
PHASES = ("ceiling", OURS, "capacity", "precise", "redis", "redis-aof", "sustained")
#: The phases that sample the worker (the profiled run's).
PROFILED_PHASES = (OURS, "capacity", "precise", "sustained")
#: Bulk load rate assumed for planning when the ingest of this run was not measured (batched, timers/s).
ASSUMED_LOAD_RATE = 40_000.0


class Run:
    def __init__(
        self,
        profile: Profile,
        out_dir: Path,
        work_dir: Path,
        command: str,
        only: Sequence[str] = PHASES,
        *,
        profiled: bool = False,
    ) -> None:
        self.profile = profile
        self.only = frozenset(only)
        self.out_dir = out_dir
        self.work_dir = work_dir
        self.results = Results(profile=profile.name, started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
        self.results.command = command
        self.results.steady_lead_s = profile.steady_lead_s
        self.results.sizes = dataclasses.asdict(profile)
        #: Samples the worker with py-spy: only in a run whose figures are not kept (see :func:`run`),
        #: which measures the worker alone.
        self.profiled = profiled
        self.profiler = Profiler(profiled, work_dir)
        self._t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self._t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def attempt(self, what: str, step: Callable[[], T]) -> T | None:
        """Run one measurement; on failure record it (with the traceback in the work dir) and go on."""
        self.say(f"{what} ...")
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - one failed measurement must not lose the others
            trace = self.work_dir / "errors.log"
            with open(trace, "a") as log:
                log.write(f"--- {what}\n{traceback.format_exc()}\n")
            self.results.errors.append(f"{what}: {exc} (traceback in {trace})")
            self.say(f"{what} FAILED: {exc}")
            return None

    @contextlib.contextmanager
    def block(self, what: str) -> Iterator[None]:
        """Like :meth:`attempt` for a ``with`` block that sets up shared state."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001
            with open(self.work_dir / "errors.log", "a") as log:
                log.write(f"--- {what}\n{traceback.format_exc()}\n")
            self.results.errors.append(f"{what}: {exc}")
            self.say(f"{what} FAILED: {exc}")

    def add_fire(self, fire: Fire | None) -> None:
        if fire is not None:
            self.results.fires.append(fire)
            late = fire.lateness
            self.say(
                f"  {fire.system} {fire.workload}: {fire.fire_rate:,.0f}/s, "
                f"{late.received:,}/{late.expected:,} received, lateness p50 {late.p50_ms:,.0f} "
                f"p99 {late.p99_ms:,.0f} max {late.max_ms:,.0f} ms"
            )

    def execute(self) -> Results:
        r, p = self.results, self.profile
        r.machine, r.versions = machine(), versions()
        with self.block("broker"), open_broker(self.work_dir) as broker:
            r.broker = broker.describe()
            ctx = FireContext(broker, self.work_dir, p.tail_timeout_s, p.load_margin_s)
            if "ceiling" in self.only:
                r.ceiling = self.attempt("ceiling", lambda: ceiling.measure(broker, p.ceiling_records))
            load_rate, batched = self.ours(broker, ctx) if OURS in self.only else (ASSUMED_LOAD_RATE, True)
            if "capacity" in self.only:
                self.capacity(broker, ctx, load_rate, batched)
            if "precise" in self.only:
                self.precise(broker, ctx, load_rate, batched)
            for durable in (False, True):
                if ("redis-aof" if durable else "redis") in self.only:
                    self.redis(broker, ctx, durable=durable)
            if "sustained" in self.only:
                self.sustained(broker, ctx)
        r.profiles = self.profiler.summaries
        r.duration_s = time.monotonic() - self._t0
        return r

    def ours(self, broker: Broker, ctx: FireContext) -> tuple[float, bool]:
        """Ingest and the fire workloads on one instance; returns (bulk load rate, batched?).

        The fire workloads send their requests in batched records whenever that path worked,
        whichever path was faster in this run: the same load in every run and every bench, so
        that their figures compare (one ``Future`` per record takes the worker more CPU to read).
        """
        r, p = self.results, self.profile
        rates: dict[str, float] = {}
        with self.block("kafka-timers"), service_stack(broker, self.work_dir, "main") as stack:
            pid = stack.worker_pid
            for path in ("single", "batched"):
                ing = self.attempt(
                    f"ingest {path}",
                    lambda path=path: service.ingest(  # type: ignore[misc]
                        stack,
                        batched=path == "batched",
                        count=p.ingest_records if path == "single" else p.batched_timers,
                        profiler=self.profiler,
                    ),
                )
                if ing is not None:
                    r.ingest.append(ing)
                    self.say(f"  ingest {path}: {ing.rate:,.0f}/s {ing.note}")
                    rates[path] = ing.rate
                if path == "single":
                    topic = stack.common.topics.request
                    r.floor = self.attempt(
                        "faust floor",
                        lambda topic=topic: faust_floor.measure(  # type: ignore[misc]
                            broker, topic, p.ingest_records, self.work_dir
                        ),
                    )
            batched = "batched" in rates
            load_rate = rates.get("batched", rates.get("single", 0.0))
            system = KafkaTimers(stack, batched=batched, load_rate=load_rate or 1000.0)
            self.add_fire(
                self.attempt(
                    "hot second",
                    lambda: scheduled(
                        ctx,
                        system,
                        "hot-second",
                        p.hot_timers,
                        1.0,
                        0.1,
                        firing=self.profiler.burst(pid, "hot-second"),
                    ),
                )
            )
            self.add_fire(
                self.attempt(
                    "spread",
                    lambda: scheduled(ctx, system, "spread", p.spread_timers, p.spread_window_s, 1.0),
                )
            )
            for rate in p.steady_rates:
                with self.profiler.sample(pid, f"steady-{rate}"):
                    self.add_fire(
                        self.attempt(
                            f"steady {rate}/s",
                            lambda rate=rate: steady_rate(  # type: ignore[misc]
                                ctx, system, f"steady-{rate}", rate, p.steady_duration_s, p.steady_lead_s
                            ),
                        )
                    )
        return load_rate or 1000.0, batched

    def capacity(self, broker: Broker, ctx: FireContext, load_rate: float, batched: bool) -> None:
        p = self.profile
        with self.block("kafka-timers capacity"), service_stack(broker, self.work_dir, "capacity") as stack:
            system = KafkaTimers(stack, batched=batched, load_rate=load_rate)
            cap = self.attempt(
                "capacity",
                lambda: service.capacity(
                    stack,
                    system,
                    broker,
                    ctx,
                    self.profiler,
                    pending=p.capacity_pending,
                    hot=p.capacity_hot,
                    single_budget_s=p.single_load_budget_s,
                ),
            )
            if cap is not None:
                self.results.capacity.append(cap)
                self.say(f"  capacity: {cap.pending:,} pending, worker RSS peak {cap.rss_peak / 1e6:,.0f} MB")
                self.add_fire(cap.hot)

    def precise(self, broker: Broker, ctx: FireContext, load_rate: float, batched: bool) -> None:
        p = self.profile
        with (
            self.block("precise mode"),
            service_stack(broker, self.work_dir, "precise", PRECISE_ENV) as stack,
        ):
            system = KafkaTimers(stack, batched=batched, load_rate=load_rate)
            self.add_fire(
                self.attempt(
                    "precise hot second",
                    lambda: scheduled(
                        ctx,
                        system,
                        "precise-hot-second",
                        p.hot_timers,
                        1.0,
                        0.1,
                        firing=self.profiler.burst(stack.worker_pid, "precise-hot-second"),
                    ),
                )
            )
            for rate in p.precise_rates:
                with self.profiler.sample(stack.worker_pid, f"precise-{rate}"):
                    self.add_fire(
                        self.attempt(
                            f"precise {rate}/s",
                            lambda rate=rate: steady_rate(  # type: ignore[misc]
                                ctx, system, f"precise-{rate}", rate, p.steady_duration_s, p.steady_lead_s
                            ),
                        )
                    )
        # The way from a producer to the receiver alone, with no worker on it: what precise mode
        # stands on.
        for rate in p.precise_rates:
            self.add_fire(
                self.attempt(
                    f"direct produce {rate}/s",
                    lambda rate=rate: direct.measure(  # type: ignore[misc]
                        ctx, rate, p.steady_duration_s, p.steady_lead_s
                    ),
                )
            )

    def redis(self, broker: Broker, ctx: FireContext, *, durable: bool) -> None:
        """The Redis design; durable: its ingest, hot second and steady rates only."""
        p, r = self.profile, self.results
        label = "redis (AOF everysec)" if durable else "redis"
        with (
            self.block(label),
            redis_baseline.redis_design(
                broker, self.work_dir, durable=durable, zadd_count=p.batched_timers
            ) as design,
        ):
            r.zadd_rates[design.name] = design.load_rate()
            self.say(f"  {design.name} ZADD: {design.load_rate():,.0f}/s")
            self.add_fire(
                self.attempt(
                    f"{label} hot second",
                    lambda: scheduled(ctx, design, "hot-second", p.hot_timers, 1.0, 0.1),
                )
            )
            if not durable:
                self.add_fire(
                    self.attempt(
                        f"{label} spread",
                        lambda: scheduled(ctx, design, "spread", p.spread_timers, p.spread_window_s, 1.0),
                    )
                )
            for rate in p.steady_rates:
                self.add_fire(
                    self.attempt(
                        f"{label} steady {rate}/s",
                        lambda rate=rate: steady_rate(  # type: ignore[misc]
                            ctx, design, f"steady-{rate}", rate, p.steady_duration_s, p.steady_lead_s
                        ),
                    )
                )
            if durable:
                return
            cap = self.attempt(
                f"{label} capacity",
                lambda: redis_baseline.capacity(design, ctx, pending=p.capacity_pending, hot=p.capacity_hot),
            )
            if cap is not None:
                r.capacity.append(cap)
                self.add_fire(cap.hot)

    def sustained(self, broker: Broker, ctx: FireContext) -> None:
        """The sustained rate of a fresh worker (batched requests), then of the in-memory Redis design."""
        p = self.profile

        def search(system: System) -> None:
            # Kept from the start: the rates a failed step's search held before it still count.
            found = Sustained(system.name, p.sustained_hold_s, sustained.P99_LIMIT_MS)
            self.results.sustained.append(found)
            self.attempt(
                f"sustained {system.name}",
                lambda: sustained.measure(
                    found,
                    ctx,
                    system,
                    start=p.sustained_start,
                    lead_s=p.steady_lead_s,
                    steps=p.sustained_steps,
                    say=self.say,
                ),
            )
            self.say_sustained(found)

        with self.block("sustained kafka-timers"), service_stack(broker, self.work_dir, "sustained") as stack:
            system = KafkaTimers(stack, batched=True, load_rate=ASSUMED_LOAD_RATE)
            with self.profiler.sample(stack.worker_pid, "sustained"):
                search(system)
        if self.profiled:
            return
        with (
            self.block("sustained redis"),
            # The ZADD rate measured on the way in is the redis row's; a chunk is enough here.
            redis_baseline.redis_design(broker, self.work_dir, durable=False, zadd_count=CHUNK) as design,
        ):
            search(design)

    def say_sustained(self, found: Sustained) -> None:
        held, failed = found.held, found.not_held
        self.say(
            f"  {found.system} sustained: "
            + (f"held {held.rate:,}/s" if held else "no rate held")
            + (f", not {failed.rate:,}/s ({failed.failed})" if failed else "")
        )


def run(
    profile: Profile,
    out_dir: Path,
    work_dir: Path,
    command: str,
    repeat: int = 1,
    only: Sequence[str] = PHASES,
) -> tuple[list[Results], list[Path]]:
    """Measure everything ``repeat`` times, store the results under ``out_dir`` and render its pages;
    return the results and the pages written."""
    runs = []
    for index in range(repeat):
        run_dir = work_dir / f"run-{index + 1}" if repeat > 1 else work_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if repeat > 1:
            print(f"=== run {index + 1} of {repeat} ===", file=sys.stderr, flush=True)
        runs.append(Run(profile, out_dir, run_dir, command, only).execute())
    profiled = [phase for phase in only if phase in PROFILED_PHASES]
    if profile.profile_worker and profiled and runs:
        # py-spy takes CPU from the machine the worker shares with the broker and the load: a
        # worker sampled while measured is slower than the ceiling and Redis beside it (5 % on a
        # hot second, 28,000 timers/s not sustained that were). So the profiles come from a run
        # of their own, whose figures are not kept.
        print(
            "=== profiled run: where the worker's time goes (figures not kept) ===",
            file=sys.stderr,
            flush=True,
        )
        run_dir = work_dir / "profiled"
        run_dir.mkdir(parents=True, exist_ok=True)
        runs[0].profiles = Run(profile, out_dir, run_dir, command, profiled, profiled=True).execute().profiles
    plots.draw(runs, (out_dir / RESULTS_FILE).parent)
    store(out_dir, "runs", runs)
    return runs, render(out_dir)
