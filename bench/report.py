"""``docs/BENCHMARKS.md`` from the :class:`Results` of one or more runs (plots: :mod:`bench.plots`).

With several runs every figure is the median over the runs, followed by its spread
(min–max); a ratio is computed inside each run, then the median taken. Plots of
distributions and rates over time show the first run; the hot-second plot shows all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from bench.aggregate import Getter, Spread, of_fire, percent, rate, ratio, spread
from bench.aggregate import ms as _ms
from bench.capacity import read_report
from bench.collector import FETCH_WAIT_MS
from bench.plots import (
    HOT_PLOT,
    Runs,
    first_fire,
    plot_fire_rate,
    plot_hot_second,
    plot_lateness,
    workload_title,
)
from bench.profiling import profiles_section
from bench.redis_baseline import DURABLE_ARGS
from bench.results import OURS, REDIS, REDIS_AOF, REDIS_SYSTEMS, Capacity, Fire, Results, plain
from bench.targets import MISSED, evaluate

PLOT_DIR = "bench"
WHY_REDIS_AHEAD = {
    "ingest": "a ZADD is one write to Redis's memory, acknowledged at once (the durable setup appends it "
    "to a file that is fsynced once a second, off the ZADD's path); a timer request goes through Kafka, "
    "a Faust consumer, RocksDB and a changelog write before it counts as accepted",
    "fire": "per fired timer our worker produces two records — the callback and a changelog tombstone — "
    "adds its id to a piece's `timer-events` FIRED record, waits for both records' delivery reports and "
    "deletes two RocksDB keys (the timer and its id index), where the poller produces one record and "
    "removes a whole chunk with one ZREM (in memory; appended to the file by the durable setup)",
    "slow-dispatch": "our worker sends a second's timers at its fire rate (above), so at this size the "
    "last of them leave well after their tick: they wait behind the earlier ones, not for the tick",
    "tick-path": "both designs are driven once a second; the difference is the path of the tick (an "
    "oscillator record through Kafka and a Faust consumer vs. a local timer in the poller)",
}
#: A lateness gap above this (ms) is the dispatch falling behind, not the tick path.
SLOW_DISPATCH_MS = 200.0


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def _ceiling(r: Results) -> float | None:
    return r.ceiling.rate if r.ceiling else None


def _rate_and_share(runs: Runs, get: Getter) -> list[str]:
    """Two cells: the rate, and its share of the same run's ceiling."""
    rates = spread(runs, get)
    if not rates.known:
        return ["—", "—"]
    return [rates.show(rate), spread(runs, ratio(get, _ceiling)).show(percent)]


def _ingest_rate(path: str) -> Getter:
    def get(r: Results) -> float | None:
        ing = r.ingest_of(path)
        return ing.rate if ing and ing.available and ing.rate else None

    return get


def throughput_table(runs: Runs) -> list[str]:
    rows = [
        "| measurement | kafka-timers | ratio to ceiling | redis-zset (in memory) | ratio to ceiling | "
        "redis-zset-aof (durable) | ratio to ceiling |",
        "|---|---|---|---|---|---|---|",
    ]
    blank = ["", "", "", ""]
    first = runs[0]
    if any(r.ceiling for r in runs):
        count = next(r.ceiling.count for r in runs if r.ceiling)
        cells = [spread(runs, _ceiling).show(rate), "100 %", *blank]
        rows.append(f"| ceiling: consume → produce pass-through ({count:,} records) | {' | '.join(cells)} |")
    if any(r.floor for r in runs):
        count = next(r.floor.count for r in runs if r.floor)
        floor: Getter = lambda r: r.floor.rate if r.floor else None  # noqa: E731
        cells = [*_rate_and_share(runs, floor), *blank]
        rows.append(f"| Faust floor: bare agent draining the requests ({count:,}) | {' | '.join(cells)} |")
    for ing in first.ingest:
        what = "one `Future` per record" if ing.path == "single" else "batched records (`schedule_many`)"
        ours = _rate_and_share(runs, _ingest_rate(ing.path))
        if ours[0] == "—":
            ours = [ing.note or "not available", "—"]
        cells = list(ours)
        for system in REDIS_SYSTEMS:
            zadd: Getter = lambda r, s=system: r.zadd_rates.get(s)  # type: ignore[misc]  # noqa: E731
            if ing.path == "batched" and spread(runs, zadd).known:
                pair = _rate_and_share(runs, zadd)
                cells += [pair[0] + " (pipelined ZADD)", pair[1]]
            else:
                cells += ["", ""]
        rows.append(f"| ingest, {what} ({ing.timers:,} timers) | {' | '.join(cells)} |")
    for workload in ("hot-second", "spread", "capacity-hot"):
        known = [f for s in (OURS, *REDIS_SYSTEMS) if (f := first_fire(runs, s, workload))]
        if not known:
            continue
        cells = []
        for system in (OURS, *REDIS_SYSTEMS):
            cells += _rate_and_share(runs, of_fire(system, workload, lambda f: f.fire_rate))
        rows.append(f"| fire, {workload_title(known[0])} | {' | '.join(cells)} |")
    return rows


#: Rows of one system together, ours first, whatever a failed measurement did to the order.
SYSTEM_ORDER = (OURS, *REDIS_SYSTEMS)


def _system_rank(system: str) -> int:
    return SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER else len(SYSTEM_ORDER)


def _pairs(runs: Runs) -> list[tuple[str, str]]:
    """(system, workload) of every fire in any run, by system, then in the order measured."""
    found = list(dict.fromkeys((f.system, f.workload) for r in runs for f in r.fires))
    return sorted(found, key=lambda pair: _system_rank(pair[0]))


def lateness_table(runs: Runs) -> list[str]:
    rows = [
        "| workload | system | received | p50 ms | p99 ms | max ms | early | p99 at dispatch ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, workload in _pairs(runs):
        fires = [f for r in runs if (f := r.fire(system, workload)) is not None]
        late = [f.lateness for f in fires]
        cells = [
            f"{sum(x.received for x in late):,} of {sum(x.expected for x in late):,}",
            *(
                spread(runs, of_fire(system, workload, get)).show(_ms)
                for get in (
                    lambda f: f.lateness.p50_ms,
                    lambda f: f.lateness.p99_ms,
                    lambda f: f.lateness.max_ms,
                )
            ),
            str(sum(x.early for x in late)),
            spread(runs, of_fire(system, workload, lambda f: f.lateness.fired_p99_ms)).show(_ms),
        ]
        rows.append(f"| {workload_title(fires[0])} | {system} | {' | '.join(cells)} |")
    return rows


def precise_table(runs: Runs) -> list[str]:
    """Precise mode at dispatch (``kt-fired-ms`` − due) and at the receiver (receive − ``kt-due-ms``)."""
    rows = [
        "| workload | at dispatch p50 ms | p99 ms | max ms | at the receiver p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, workload in _pairs(runs):
        if system != OURS or not workload.startswith("precise"):
            continue
        fire = first_fire(runs, system, workload)
        assert fire is not None  # noqa: S101 - listed by _pairs
        cells = [
            spread(runs, of_fire(system, workload, get)).show(_ms)
            for get in (
                lambda f: f.lateness.fired_p50_ms,
                lambda f: f.lateness.fired_p99_ms,
                lambda f: f.lateness.fired_max_ms,
                lambda f: f.lateness.p50_ms,
                lambda f: f.lateness.p99_ms,
                lambda f: f.lateness.max_ms,
            )
        ]
        rows.append(f"| {workload_title(fire)} | {' | '.join(cells)} |")
    return rows if len(rows) > 2 else []


def capacity_table(runs: Runs) -> list[str]:
    rows = [
        "| system | pending | memory before → peak → after | memory per pending timer | disk | "
        "disk per timer | load time |",
        "|---|---|---|---|---|---|---|",
    ]
    systems = sorted(dict.fromkeys(c.system for r in runs for c in r.capacity), key=_system_rank)
    for system in systems:
        caps = [c for r in runs if (c := r.capacity_of(system)) is not None]

        def of(read: Callable[[Capacity], float], system: str = system) -> Spread:
            def get(run: Results) -> float | None:
                cap = run.capacity_of(system)
                return read(cap) if cap is not None else None

            return spread(runs, get)

        memory = " → ".join(of(read).show(_mb) for read in (
            lambda c: c.rss_before, lambda c: c.rss_peak, lambda c: c.rss_after))  # fmt: skip
        how = "used_memory" if caps[0].used_memory_delta is not None else "RSS growth"
        cells = [
            of(lambda c: c.pending).show(lambda v: f"{v:,.0f}"),
            memory,
            f"{of(lambda c: c.memory_per_timer).show(lambda v: f'{v:,.0f} B')} ({how})",
            of(lambda c: c.disk_bytes).show(_mb),
            of(lambda c: c.disk_per_timer).show(lambda v: f"{v:,.0f} B"),
            of(lambda c: c.load_seconds).show(lambda v: f"{v:,.1f} s"),
        ]
        rows.append(f"| {system} | {' | '.join(cells)} |")
    return rows


def targets_section(runs: Runs, out_dir: Path | None = None) -> list[str]:
    """The targets' verdicts; the 10 M ones from ``out_dir``'s capacity report when these runs loaded less."""
    rows = ["| target | measured | verdict |", "|---|---|---|"]
    profiled = {p.phase: p for p in runs[0].profiles}
    capacity = out_dir / PLOT_DIR / "capacity.md" if out_dir is not None else None
    apart = read_report(capacity.read_text()) if capacity is not None and capacity.exists() else []
    missed = []
    for v in evaluate(runs, apart):
        verdict = v.status + (f", {v.gap}" if v.gap else "")
        rows.append(f"| {v.target} | {v.measured} | **{verdict}** |")
        if v.status == MISSED:
            missed.append(v)
    if not missed:
        return rows
    head = "Each missed target: where the worker's CPU went (py-spy, run 1), and what would close it."
    lines = [*rows, "", head, ""]
    shown: set[str] = set()
    for v in missed:
        lines.append(f"- **{v.target}** ({v.gap}).")
        prof = profiled.get(v.phase)
        if prof is not None and prof.top_self:
            if prof.phase in shown:
                lines.append(f"  - Profile: phase `{prof.phase}`, as above.")
            else:
                top = "; ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_self[:5])
                ours = "; ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_ours[:4])
                lines.append(
                    f"  - Profile: phase `{prof.phase}` ({prof.samples:,} samples): own time {top}; "
                    f"our code on the stack {ours}."
                )
                shown.add(prof.phase)
        if v.closes:
            lines.append(f"  - What would close it: {v.closes}.")
    return lines


def _clearly_more(a: float, b: float, floor: float = 0.0) -> bool:
    """``a`` beats ``b`` by more than run-to-run noise: 5 %, and at least ``floor``."""
    return a - b > max(0.05 * abs(b), floor)


def _redis_cell(runs: Runs, read: Callable[[Fire], float], workload: str, fmt: str) -> str:
    """``in memory X, durable Y`` (medians) for a figure of both Redis setups."""
    parts = []
    for system, label in ((REDIS, "in memory"), (REDIS_AOF, "durable")):
        value = spread(runs, of_fire(system, workload, read))
        if value.known:
            parts.append(f"{label} {value.median:,.0f}{fmt}")
    return ", ".join(parts)


def redis_ahead_section(runs: Runs) -> list[str]:
    """Where the Redis design (in memory, the faster setup) beats us by more than noise, medians."""
    lines = []
    best_ingest = max(
        (spread(runs, _ingest_rate(path)).median for path in ("single", "batched")
         if spread(runs, _ingest_rate(path)).known),
        default=0.0,
    )  # fmt: skip
    zadd = {s: spread(runs, lambda r, s=s: r.zadd_rates.get(s)) for s in REDIS_SYSTEMS}  # type: ignore[misc]
    if zadd[REDIS].known and _clearly_more(zadd[REDIS].median, best_ingest):
        durable = f", durable {zadd[REDIS_AOF].median:,.0f}/s" if zadd[REDIS_AOF].known else ""
        lines.append(f"- **Accepting timers**: Redis in memory {zadd[REDIS].median:,.0f}/s by ZADD{durable} "
                     f"vs our best {best_ingest:,.0f}/s: {WHY_REDIS_AHEAD['ingest']}.")  # fmt: skip
    for workload in ("hot-second", "spread", "capacity-hot"):
        ours = spread(runs, of_fire(OURS, workload, lambda f: f.fire_rate))
        theirs = spread(runs, of_fire(REDIS, workload, lambda f: f.fire_rate))
        fire = first_fire(runs, OURS, workload)
        if fire and ours.known and theirs.known and _clearly_more(theirs.median, ours.median):
            both = _redis_cell(runs, lambda f: f.fire_rate, workload, "/s")
            title = workload_title(fire)
            lines.append(f"- **Fire rate, {title}**: Redis {both} vs ours {ours.median:,.0f}/s: "
                         f"{WHY_REDIS_AHEAD['fire']}.")  # fmt: skip
    for system, workload in _pairs(runs):
        if system != OURS or workload.startswith("precise"):
            continue
        fire = first_fire(runs, OURS, workload)
        p99 = spread(runs, of_fire(OURS, workload, lambda f: f.lateness.p99_ms))
        theirs = spread(runs, of_fire(REDIS, workload, lambda f: f.lateness.p99_ms))
        if fire is None or not (p99.known and theirs.known):
            continue
        if not _clearly_more(p99.median, theirs.median, floor=10.0):
            continue
        # A hot second's p99 is its last timers: how fast the second goes out, not its tick.
        if p99.median - theirs.median > SLOW_DISPATCH_MS or fire.window_s == 0.0:
            fired = spread(runs, of_fire(OURS, workload, lambda f: f.lateness.fired_p99_ms))
            their_fired = spread(runs, of_fire(REDIS, workload, lambda f: f.lateness.fired_p99_ms))
            why = (
                f"{WHY_REDIS_AHEAD['slow-dispatch']} (p99 at dispatch, by the dispatcher's own clock: "
                f"{fired.median:,.0f} ms vs {their_fired.median:,.0f} ms, so the delay is in the worker, "
                "not in delivery); each fired timer also costs us more (see the fire rates above)"
            )
        else:
            why = WHY_REDIS_AHEAD["tick-path"]
        both = _redis_cell(runs, lambda f: f.lateness.p99_ms, workload, " ms")
        lines.append(
            f"- **Lateness p99, {workload_title(fire)}**: Redis {both} vs ours {p99.median:,.0f} ms: {why}."
        )
    return lines or ["- Nowhere in these runs."]


def method_section(r: Results) -> list[str]:
    return [
        "- **Broker**: " + r.broker + ". Every measurement uses its own topics (4 partitions). Tansu keeps "
        "everything in memory, including the timer table's changelog, so the broker's memory grows with "
        "pending timers; that memory is not counted as the worker's.",
        "- **Ceiling**: " + (r.ceiling.detail if r.ceiling else "") + "; records shaped like callbacks "
        "(12-byte key, 100-byte payload, four `kt-*` headers). Every throughput is also given as a share "
        "of it.",
        "- **Faust floor**: " + (r.floor.detail if r.floor else "") + ", on the very `timer-request` records "
        "the single-record ingest measurement sent.",
        "- **Ingest**: requests sent as fast as the client library sends them, each timer due a day ahead; "
        "the rate is read from the worker's `timers_scheduled_total` (sampled every 0.2 s) while it rises.",
        "- **Fire**: timers loaded first, with due times planned to fall after loading ends; the rate is "
        "callbacks received per second from the first to the last one. Steady workloads instead send each "
        f"request {r.steady_lead_s:g} s before its due time while earlier timers fire, "
        "so ingest and firing share the worker as in production.",
        "- **Lateness** = receive time − `kt-due-ms` (*at the receiver*), taken by a separate collector "
        f"process (confluent-kafka, `assign()`, `fetch.wait.max.ms={FETCH_WAIT_MS}`) once per fetched batch; "
        "*at dispatch* is `kt-fired-ms` − due instead, the dispatcher's own clock when it produced the "
        "callback. Precise mode is measured at a steady rate and during a hot second on its own worker. "
        "Clock: the wall clock (`CLOCK_REALTIME`) "
        "of this one machine, read by the load generator (due), the dispatcher (fired) and the "
        "collector (received).",
        "- **Capacity**: a fresh worker loaded with far-future timers; memory is the resident size of the "
        "worker process tree (sampled every 0.5 s, peak shown), disk its data directory (allocated blocks). "
        "For Redis, memory per timer is the growth of `used_memory` (INFO memory).",
        "- **Redis baseline** (`bench/redis_baseline.py`): ZADD pipelined (10 × 500 members per round trip), "
        "member = the serialized `Future`; a poller process on every second: ZRANGEBYSCORE … LIMIT 10000 → "
        "produce (the worker's producer settings) → flush → one ZREM per chunk; hiredis parser. Two "
        "setups: `redis-zset`, without persistence (faster than any durable setup, and it loses timers on "
        "restart), and `redis-zset-aof`, durable: `redis-server " + " ".join(DURABLE_ARGS) + "` with its "
        "append-only file in its own temporary directory (a crash loses at most the last second); "
        "the durable one is measured on ingest, the hot second and the steady rates.",
        "- **Profiles**: py-spy sampling the worker without pausing it, per measurement (run 1); a hot "
        "second's from the moment its timers are all accepted to its last callback (its load is not in "
        "it), at 100 samples a second instead of 50.",
        "- **Repeats**: with `--repeat N` every measurement runs N times, each run on a fresh broker; "
        "a figure is the median of the runs with the spread (min–max) in brackets, a ratio is taken "
        "inside each run (both sides under the same machine load) before the median.",
    ]


def sizes_line(r: Results) -> str:
    s = r.sizes
    if not s:
        return ""
    steady = ", ".join(f"{rate:,}/s" for rate in s.get("steady_rates", ()))  # type: ignore[attr-defined]
    return (
        f"Sizes of profile {r.profile}: hot second {s['hot_timers']:,} timers; spread {s['spread_timers']:,} "
        f"over {s['spread_window_s']:g} s; steady {steady} for {s['steady_duration_s']:g} s each, requests "
        f"sent {s['steady_lead_s']:g} s ahead; capacity {s['capacity_pending']:,} pending (the sizes "
        "actually reached are in the tables). `make bench-full` runs 1 M / 60 s / 10 M."
    )


def _notes(runs: Runs) -> list[str]:
    notes: list[str] = []
    for index, r in enumerate(runs):
        prefix = f"run {index + 1}: " if len(runs) > 1 else ""
        found = list(r.notes)
        for fire in r.fires:
            found += [f"{fire.system}, {workload_title(fire)}: {n}" for n in fire.notes]
        for cap in r.capacity:
            found += [f"{cap.system}, capacity: {n}" for n in cap.notes]
            if cap.broker_rss_delta is not None:
                found.append(
                    f"{cap.system}, capacity: the embedded broker grew by {_mb(cap.broker_rss_delta)} while "
                    "the timers were loaded (requests, changelog and events are kept in Tansu's memory; a "
                    "Kafka cluster keeps them on its disks)"
                )
        found += [f"{i.path} ingest: {i.note}" for i in r.ingest if i.note]
        notes += [prefix + n for n in found]
    return notes


#: Reports measured by their own commands, whose first table this report repeats: (file, heading).
APART = (
    ("jobs.md", "Spark compaction of a 10 M-record log (`make bench-jobs`)"),
    ("capacity.md", "One worker from few to 10 M pending timers (`make bench-capacity`)"),
)


def measured_apart(out_dir: Path) -> list[str]:
    """The run line and first table of each report under ``out_dir/bench`` measured apart."""
    lines: list[str] = []
    for name, heading in APART:
        path = out_dir / PLOT_DIR / name
        if not path.exists():
            continue
        text = path.read_text().splitlines()
        run = next((line for line in text if line.startswith("Run on ")), "")
        start = next((i for i, line in enumerate(text) if line.startswith("|")), len(text))
        end = next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))
        more = f"More: [bench/{name}](bench/{name})."
        lines += [f"### {heading}", "", run, "", *text[start:end], "", more, ""]
    return lines


def write(runs: Runs, out_dir: Path) -> Path:
    """Write ``BENCHMARKS.md`` and the plots under ``out_dir``; return the report's path."""
    first = runs[0]
    plots = out_dir / PLOT_DIR
    plots.mkdir(parents=True, exist_ok=True)
    if first.fires:
        plot_lateness(first, plots / "lateness.png")
        plot_fire_rate(first, plots / "fire-rate.png")
    plot_hot_second(runs, plots / HOT_PLOT)
    (plots / "results.json").write_text(
        json.dumps({"runs": [plain(r) for r in runs]}, indent=2, default=str) + "\n"
    )
    machine = [f"| {k} | {v} |" for k, v in first.machine.items()]
    if len(runs) > 1:
        machine += [f"| load average at start of run {i + 1} | {r.machine.get('load average at start', '')} |"
                    for i, r in enumerate(runs[1:], start=1)]  # fmt: skip
    versions = [f"| {k} | {v} |" for k, v in first.versions.items()]
    precise = precise_table(runs)
    if not any(r.precise_available for r in runs):
        precise_lines = [
            "Precise mode (`TIMERS_PRECISE=1`) is **not available** in this build of the worker: "
            "not measured."
        ]
    else:
        precise_lines = [
            "At dispatch: `kt-fired-ms` − due (the worker's clock when it produced the callback); at the "
            "receiver: receive time − `kt-due-ms`.",
            "",
            *precise,
        ]
    minutes = sum(r.duration_s for r in runs) / 60
    if len(runs) > 1:
        how = (
            f"{len(runs)} runs, the first started {first.started}, {minutes:.1f} min in all: "
            f"`{first.command}`. "
            f"Every figure is the **median of the {len(runs)} runs, with the spread (min–max) in brackets**; "
            "ratios are computed within each run (to the pass-through ceiling or to Redis measured in the "
            "same run), then the median taken. Each run uses a fresh broker on one machine."
        )
    else:
        how = (
            f"One run on {first.started} in {minutes:.1f} min: `{first.command}`. Every figure below comes "
            "from this one run, on one broker and one machine; ratios are to the pass-through ceiling "
            "measured in the same run. Each figure is one measurement, not a median: compare runs before "
            "trusting a difference of a few percent (`make bench` runs three times and reports medians)."
        )
    lines = [
        "# Benchmarks",
        "",
        f"Profile **{first.profile}**: {how}",
        "",
        "Regenerate: `make bench` (profile quick three times, about 20 minutes on a quiet machine), "
        "`make bench-full` (1 M-timer hot second, 10 M pending), either against any Kafka with "
        "`KAFKA_BOOTSTRAP_SERVERS=host:9092 make bench`; one quick run: `python -m bench --profile quick`.",
        "",
        "The Spark jobs are measured apart: [compaction speed](bench/jobs.md) (`make bench-jobs`, a "
        "10 M-record log with 1, 2 and 4 Spark tasks). What each timer costs the worker, what was done "
        "about it and what would close the gaps below: [PERFORMANCE.md](PERFORMANCE.md).",
        "",
        "## Results",
        "",
        sizes_line(first),
        "",
        "### Throughput",
        "",
        *throughput_table(runs),
        "",
        "### Lateness",
        "",
        *lateness_table(runs),
        "",
        "### Precise mode (`TIMERS_PRECISE=1`): at dispatch and at the receiver",
        "",
        *precise_lines,
        "",
        "### Capacity",
        "",
        *capacity_table(runs),
        "",
        *measured_apart(out_dir),
        "## Targets",
        "",
        *targets_section(runs, out_dir),
        "",
        "## Where Redis is ahead of us, and why",
        "",
        *redis_ahead_section(runs),
        "",
        "## Plots",
        "",
        f"![Hot second: callbacks per 100 ms after due]({PLOT_DIR}/{HOT_PLOT})",
        "",
        f"![Lateness distribution per workload]({PLOT_DIR}/lateness.png)",
        "",
        f"![Fire rate over time]({PLOT_DIR}/fire-rate.png)",
        "",
        "The hot-second plot shows every run; the other two show run 1.",
        "",
        "## How it is measured",
        "",
        *method_section(first),
        "",
        "## Where the worker's time goes (py-spy, own time per function, run 1)",
        "",
        *profiles_section(first.profiles),
        "",
        "## Machine and versions",
        "",
        "| machine | |",
        "|---|---|",
        *machine,
        "",
        "| software | version |",
        "|---|---|",
        *versions,
        "",
    ]
    notes = _notes(runs)
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    errors = [(f"run {i + 1}: " if len(runs) > 1 else "") + e for i, r in enumerate(runs) for e in r.errors]
    if errors:
        lines += ["## Errors (measurements that failed)", "", *[f"- {e}" for e in errors], ""]
    path = out_dir / "BENCHMARKS.md"
    path.write_text("\n".join(lines))
    return path
