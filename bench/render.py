"""The one writer of the benchmarks' Markdown: tables rendered from ``docs/bench/results.json``.

The pages (docs/BENCHMARKS.md, docs/FAILOVER.md) are written by hand; the renderer
only replaces what lies between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``
with the block NAME made from the results. A page that does not exist yet (a
benchmark writing to a scratch directory) is made of the blocks alone, under their
headings.

With several runs of ``make bench`` every figure is the median over the runs, followed
by its spread (min–max); a ratio is computed inside each run, then the median taken.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.aggregate import (
    Getter,
    Spread,
    ceiling_rate,
    held_rate,
    of_fire,
    of_held,
    percent,
    rate,
    ratio,
    spread,
)
from bench.aggregate import ms as _ms
from bench.results import (
    DIRECT,
    OURS,
    REDIS,
    REDIS_SYSTEMS,
    Capacity,
    CapacityRun,
    CapacityStep,
    FailoverKind,
    FailoverRun,
    FailoverStep,
    Job,
    JobsRun,
    ProfileSummary,
    Results,
    Sustained,
    build,
    first_fire,
    load_runs,
    read,
    workload_title,
)
from bench.targets import MISSED, evaluate

Runs = Sequence[Results]
Block = list[str]


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def _rate_and_share(runs: Runs, get: Getter) -> list[str]:
    """Two cells: the rate, and its share of the same run's ceiling."""
    rates = spread(runs, get)
    if not rates.known:
        return ["—", "—"]
    return [rates.show(rate), spread(runs, ratio(get, ceiling_rate)).show(percent)]


def _ingest_rate(path: str) -> Getter:
    def get(r: Results) -> float | None:
        ing = r.ingest_of(path)
        return ing.rate if ing and ing.rate else None

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
        cells = [spread(runs, ceiling_rate).show(rate), "100 %", *blank]
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
            ours = [ing.note or "not measured", "—"]
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


def _count(counts: Sequence[int | None]) -> str:
    """The sum of what was counted ("—" if nothing was)."""
    known = [c for c in counts if c is not None]
    return str(sum(known)) if known else "—"


def lateness_table(runs: Runs) -> list[str]:
    rows = [
        "| workload | system | received | p50 ms | p99 ms | max ms | early | repeats | p99 at dispatch ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for system, workload in _pairs(runs):
        if system == DIRECT:
            continue  # beside precise mode, what it stands on
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
            _count([x.repeats for x in late]),
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
        if not (system == OURS and workload.startswith("precise") or system == DIRECT):
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


def _tried(found: Sustained) -> str:
    return ", ".join(f"{s.rate:,} {'✗' if s.failed else '✓'}" for s in found.steps)


#: A sustained-rate search whose steps ran out before a rate above the one held failed.
NONE_FAILED = "none failed before the steps ran out: the rate held is a lower bound"


def sustained_table(runs: Runs) -> list[str]:
    """The highest steady rate each system held, the first it did not and why, and the rates tried."""
    systems = sorted(dict.fromkeys(s.system for r in runs for s in r.sustained), key=_system_rank)
    if not systems:
        return []
    first = next(s for r in runs for s in r.sustained)
    rows = [
        f"Each rate held for {first.hold_s:g} s, requests sent {runs[0].steady_lead_s:g} s before their "
        f"due time; a rate is held when every callback came back, none early, with p99 at the receiver "
        f"≤ {first.p99_limit_ms:,.0f} ms and no backlog growing (see *How it is measured*).",
        "",
        "| system | highest rate held | p50 ms at it | p99 ms at it | lowest rate not held: why "
        "| rates tried (✓ held, ✗ not) |",
        "|---|---|---|---|---|---|",
    ]
    prefix = (lambda i: f"run {i + 1}: ") if len(runs) > 1 else (lambda i: "")
    for system in systems:
        held = spread(runs, held_rate(system))
        cells = [
            held.show(rate) if held.known and held.hi else "none",
            spread(runs, of_held(system, lambda s: s.fire.lateness.p50_ms)).show(_ms),
            spread(runs, of_held(system, lambda s: s.fire.lateness.p99_ms)).show(_ms),
        ]
        why, tried = [], []
        for i, r in enumerate(runs):
            found = r.sustained_of(system)
            if found is None:
                continue
            failed = found.not_held
            why.append(prefix(i) + (f"{failed.rate:,}/s: {failed.failed}" if failed else NONE_FAILED))
            tried.append(prefix(i) + _tried(found))
        rows.append(f"| {system} | {' | '.join(cells)} | {'; '.join(why)} | {'; '.join(tried)} |")
    share = spread(runs, ratio(held_rate(OURS), held_rate(REDIS)))
    if share.known:
        rows += ["", f"{OURS} held **{share.show(percent)}** of the rate {REDIS} held (same run)."]
    return rows


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


def targets_block(runs: Runs, capacity: CapacityRun | None = None) -> Block:
    """The targets' verdicts; the 10 M ones from ``capacity`` when these runs loaded fewer timers.

    Each missed target is followed by the profile of its phase (the profiled run) and a link to the section
    of PERFORMANCE.md that says what would close it.
    """
    rows = ["| target | measured | verdict |", "|---|---|---|"]
    profiled = {p.phase: p for p in runs[0].profiles}
    missed = []
    for v in evaluate(runs, capacity):
        verdict = v.status + (f", {v.gap}" if v.gap else "")
        rows.append(f"| {v.target} | {v.measured} | **{verdict}** |")
        if v.status == MISSED:
            missed.append(v)
    if not missed:
        return rows
    lines = [*rows, ""]
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
        if v.see:
            lines.append(f"  - What would close it: [PERFORMANCE.md](PERFORMANCE.md#{v.see}).")
    return lines


def sizes_line(r: Results) -> str:
    s = r.sizes
    if not s:
        return ""
    steady = ", ".join(f"{rate:,}/s" for rate in s.get("steady_rates", ()))  # type: ignore[attr-defined]
    sustained = (
        f"; sustained rate from {s['sustained_start']:,}/s, each held {s['sustained_hold_s']:g} s, at most "
        f"{s['sustained_steps']} rates per system"
        if "sustained_start" in s
        else ""
    )
    return (
        f"Sizes of profile {r.profile}: hot second {s['hot_timers']:,} timers; spread {s['spread_timers']:,} "
        f"over {s['spread_window_s']:g} s; steady {steady} for {s['steady_duration_s']:g} s each, requests "
        f"sent {s['steady_lead_s']:g} s ahead; capacity {s['capacity_pending']:,} pending{sustained} (the "
        "sizes actually reached are in the tables)."
    )


def _notes(runs: Runs) -> list[str]:
    notes: list[str] = []
    for index, r in enumerate(runs):
        prefix = f"run {index + 1}: " if len(runs) > 1 else ""
        found = list(r.notes)
        for fire in r.every_fire():
            found += [f"{fire.system}, {workload_title(fire)}: {n}" for n in fire.notes]
        for cap in r.capacity:
            found += [f"{cap.system}, capacity: {n}" for n in cap.notes]
            if cap.broker_rss_delta is not None:
                found.append(
                    f"{cap.system}, capacity: the broker grew by {_mb(cap.broker_rss_delta)} while the "
                    "timers were loaded"
                )
        found += [f"{i.path} ingest: {i.note}" for i in r.ingest if i.note]
        notes += [prefix + n for n in found]
    return notes


def profiles_block(profiles: Sequence[ProfileSummary]) -> Block:
    """Where the worker's CPU went in each measurement of one run."""
    lines = []
    for prof in profiles:
        if not prof.top_self:
            lines.append(f"- `{prof.phase}`: {prof.note or 'no samples'}")
            continue
        top = ", ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_self[:6])
        ours = ", ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_ours[:5])
        lines.append(f"- `{prof.phase}` ({prof.samples:,} samples): own time: {top}")
        if ours:
            lines.append(f"  - our code, time on the stack: {ours}")
    return lines or ["- Not profiled in this run."]


def summary_block(runs: Runs) -> Block:
    first = runs[0]
    minutes = sum(r.duration_s for r in runs) / 60
    if len(runs) > 1:
        how = (
            f"{len(runs)} runs, the first started {first.started}, {minutes:.1f} min in all: "
            f"`{first.command}`. Every figure is the **median of the {len(runs)} runs, with the spread "
            "(min–max) in brackets**; ratios are computed within each run, then the median taken."
        )
    else:
        how = (
            f"one run on {first.started} in {minutes:.1f} min: `{first.command}`. Each figure is one "
            "measurement, not a median."
        )
    return [f"Profile **{first.profile}**, {how} Broker: {first.broker}.", "", sizes_line(first)]


def machine_block(runs: Runs) -> Block:
    first = runs[0]
    machine = [f"| {k} | {v} |" for k, v in first.machine.items()]
    machine += [
        f"| load average at start of run {i + 1} | {r.machine.get('load average at start', '')} |"
        for i, r in enumerate(runs[1:], start=1)
    ]
    return [
        "| machine | |",
        "|---|---|",
        *machine,
        "",
        "| software | version |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in first.versions.items()),
    ]


def notes_block(runs: Runs) -> Block:
    """Notes of the runs, and the measurements that failed."""
    prefix = (lambda i: f"run {i + 1}: ") if len(runs) > 1 else (lambda i: "")
    errors = [f"{prefix(i)}failed: {e}" for i, r in enumerate(runs) for e in r.errors]
    return [f"- {n}" for n in [*_notes(runs), *errors]] or ["- None."]


def _load(values: Sequence[float]) -> str:
    return "/".join(f"{x:.1f}" for x in values)


def capacity_growth_block(run: CapacityRun) -> Block:
    """`make bench-capacity`: a row per size."""
    lines = [
        f"Run on {run.when}: `{run.command}`, on {run.cores} cores; a hot second of {run.hot:,} timers at "
        f"each size, {run.repeat} times (median, then each).",
        "",
        "| pending | loaded in | worker RSS: peak, firing → at rest | RocksDB on disk | compaction owed "
        "| broker RSS | hot second | vs. the size before | last callback after due | early | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, share in zip(run.steps, run.shares(), strict=True):
        median = statistics.median(s.rates) if s.rates else 0.0
        each = ", ".join(f"{r:,.0f}" for r in s.rates)
        broker = "—" if s.broker_gb is None else f"{s.broker_gb:.1f} GB"
        owed = "—" if s.compaction_owed_gb is None else f"{s.compaction_owed_gb:.2f} GB"
        loaded = "—" if not s.load_s else f"{s.load_s:.0f} s"
        vs = "—" if share is None else f"{share:.0%}"
        rss = f"{s.peak_rss_mb:,.0f} → {s.rss_mb:,.0f} MB" if s.peak_rss_mb else f"{s.rss_mb:,.0f} MB"
        last = ", ".join(f"{m:,.0f}" for m in s.last_ms)
        lines.append(
            f"| {s.pending:,} | {loaded} | {rss} | {s.data_gb:.2f} GB | {owed} | {broker} "
            f"| **{median:,.0f}/s** ({each}) | {vs} | {last} ms | {s.early} | {s.load_avg} |"
        )
    return lines


def jobs_block(run: JobsRun) -> Block:
    """`make bench-jobs`: a row per Spark master."""
    lines = [
        f"Run on {run.when}: `{run.command}`, on {run.cores} cores; a log of {run.records:,} request "
        f"records ({run.partitions} partitions) written in {run.fill_s:.0f} s, then compacted once per "
        "master.",
        "",
        "| master | request rows | took | rate | CPU | load before → after |",
        "|---|---|---|---|---|---|",
    ]
    for job in run.jobs:
        lines.append(
            f"| {job.master} | {job.rows:,} | {job.seconds:.1f} s | **{job.rate:,.0f}/s** | "
            f"{job.cpu_s:.0f} s ({job.cpu_s / job.rows * 1e6:.1f} µs/row) | "
            f"{_load(job.load_before)} → {_load(job.load_after)} |"
        )
    return lines


FAILOVER_KINDS = {
    "takeover": "SIGKILL → a survivor fires the dead worker's partitions",
    "restart": "SIGKILL → the restarted worker (same data dir) fires again",
}


def failover_block(run: FailoverRun) -> Block:
    """`make failover`: how long partitions stayed silent, and when each step was logged."""
    lines = [
        f"Measured by `{run.command}` on {run.when}: {run.broker}, {run.partitions} partitions, one timer "
        f"due every {run.every_ms:.0f} ms in every partition, group timeouts {run.settings}; load average "
        f"{run.load_before} before the run, {run.load_after} after ({run.cores} cores).",
        "",
        "| what | rounds | all its partitions back (median) | worst round | first partition back (median) |",
        "|---|---|---|---|---|",
        *(
            f"| {FAILOVER_KINDS.get(k.kind, k.kind)} | {k.rounds} | {k.all_back_s:.1f} s | {k.worst_s:.1f} s "
            f"| {k.first_back_s:.1f} s |"
            for k in run.kinds
        ),
        "",
        "| round | step | seconds after the SIGKILL (median) | range |",
        "|---|---|---|---|",
    ]
    for s in run.steps:
        if s.median_s is None or s.lo_s is None or s.hi_s is None:
            lines.append(f"| {s.kind} | {s.step} | — | |")
        else:
            lines.append(f"| {s.kind} | {s.step} | {s.median_s:.2f} | {s.lo_s:.2f}–{s.hi_s:.2f} |")
    return lines


#: The pages and their blocks, in order, with the heading each gets in a page made from scratch.
PAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "BENCHMARKS.md": (
        ("summary", "## Results"),
        ("throughput", "### Throughput"),
        ("lateness", "### Lateness"),
        ("precise", "### Precise mode"),
        ("sustained", "### Sustained rate"),
        ("capacity", "### Capacity"),
        ("capacity-growth", "### One worker from few to 10 M pending timers"),
        ("jobs", "### Spark compaction"),
        ("targets", "## Targets"),
        ("profiles", "## Where the worker's time goes"),
        ("machine", "## Machine and versions"),
        ("notes", "## Notes"),
    ),
    "FAILOVER.md": (("failover", "## Measured"),),
}


def blocks(results: dict[str, Any]) -> dict[str, Block]:
    """Every block the results make (a part not measured yet makes none)."""
    made: dict[str, Block] = {}
    capacity = (
        build(CapacityRun, results["capacity"], steps=CapacityStep) if results.get("capacity") else None
    )
    if results.get("runs"):
        runs = load_runs(results["runs"])
        made |= {
            "summary": summary_block(runs),
            "throughput": throughput_table(runs),
            "lateness": lateness_table(runs),
            "precise": precise_table(runs) or ["Not measured."],
            "sustained": sustained_table(runs) or ["Not measured."],
            "capacity": capacity_table(runs),
            "targets": targets_block(runs, capacity),
            "profiles": profiles_block(runs[0].profiles),
            "machine": machine_block(runs),
            "notes": notes_block(runs),
        }
    if capacity is not None:
        made["capacity-growth"] = capacity_growth_block(capacity)
    if results.get("jobs"):
        made["jobs"] = jobs_block(build(JobsRun, results["jobs"], jobs=Job))
    if results.get("failover"):
        made["failover"] = failover_block(
            build(FailoverRun, results["failover"], kinds=FailoverKind, steps=FailoverStep)
        )
    return made


def fill(text: str, made: dict[str, Block]) -> str:
    """``text`` with each ``<!-- results:NAME -->`` … ``<!-- /results:NAME -->`` holding block NAME."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in made:
            return match.group(0)
        return "\n".join([f"<!-- results:{name} -->", *made[name], f"<!-- /results:{name} -->"])

    return MARKED.sub(replace, text)


MARKED = re.compile(r"<!-- results:([a-z-]+) -->.*?<!-- /results:\1 -->", re.DOTALL)


def scratch_page(page: str, made: dict[str, Block]) -> str:
    """A page of the blocks alone, under their headings (where no hand-written page exists)."""
    lines = [f"# {page.removesuffix('.md').title()}", ""]
    for name, heading in PAGES[page]:
        if name in made:
            lines += [heading, "", f"<!-- results:{name} -->", f"<!-- /results:{name} -->", ""]
    return "\n".join(lines)


def render(docs: Path) -> list[Path]:
    """Write every block the results file under ``docs`` makes into its page; the pages written."""
    made = blocks(read(docs))
    written = []
    for page, names in PAGES.items():
        if not any(name in made for name, _ in names):
            continue
        path = docs / page
        text = path.read_text() if path.exists() else scratch_page(page, made)
        missing = [name for name, _ in names if name in made and f"<!-- results:{name} -->" not in text]
        if missing:
            raise ValueError(
                f"{path} has no place for {', '.join(missing)}: add <!-- results:NAME --> markers"
            )
        filled = fill(text, made)
        if filled != text or not path.exists():
            path.write_text(filled)
        written.append(path)
    return written


def main() -> int:
    """``python -m bench.render [DOCS]``: rewrite the pages from the results file, measuring nothing."""
    import sys

    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "docs"
    for path in render(docs):
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
