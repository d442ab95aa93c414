"""``docs/BENCHMARKS.md`` and its plots, from one run's :class:`Results`."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI or servers

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import numpy as np  # noqa: E402

from bench.collector import FETCH_WAIT_MS  # noqa: E402
from bench.results import OURS, REDIS, Capacity, Fire, Results  # noqa: E402
from bench.targets import MISSED, evaluate  # noqa: E402

PLOT_DIR = "bench"
COLORS = {OURS: "tab:blue", REDIS: "tab:red"}
WHY_REDIS_AHEAD = {
    "ingest": "a ZADD is one in-memory write acknowledged by Redis, with nothing made durable; a timer "
    "request goes through Kafka, a Faust consumer, RocksDB and a changelog write before it counts as "
    "accepted",
    "fire": "per fired timer our worker produces three records — the callback, a changelog tombstone and a "
    "`timer-events` FIRED record — and deletes it from RocksDB, where the poller produces one record and "
    "removes a whole chunk with one ZREM from memory (the price of a durable, replicated table)",
    "slow-dispatch": "at this rate our worker does not finish within a tick what the tick brings — it "
    "ingests requests and dispatches due timers on one event loop — so timers wait behind earlier work",
    "tick-path": "both designs are driven once a second; the difference is the path of the tick (an "
    "oscillator record through Kafka and a Faust consumer vs. a local timer in the poller)",
}
#: A lateness gap above this (ms) is the dispatch falling behind, not the tick path.
SLOW_DISPATCH_MS = 200.0


def _rate(value: float) -> str:
    return f"{value:,.0f}/s" if value else "—"


def _ratio(value: float, ceiling: float | None) -> str:
    return f"{100 * value / ceiling:.1f} %" if ceiling and value else "—"


def _ms(value: float) -> str:
    return "—" if value != value else f"{value:,.0f}"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def _workload_title(fire: Fire) -> str:
    name = fire.workload
    if name == "hot-second":
        return f"hot second ({fire.timers:,} timers due in one second)"
    if name == "capacity-hot":
        return f"hot second at capacity ({fire.timers:,} due)"
    if name == "spread":
        offered = f" = {fire.timers / fire.window_s:,.0f}/s" if fire.window_s else ""
        return f"spread ({fire.timers:,} timers over {fire.window_s:g} s{offered})"
    kind, _, rate = name.partition("-")
    return f"{kind} {int(rate):,}/s for {fire.window_s:g} s ({fire.timers:,} timers)"


def throughput_table(r: Results) -> list[str]:
    ceiling = r.ceiling.rate if r.ceiling else None
    rows = [
        "| measurement | kafka-timers | ratio to ceiling | redis-zset | ratio to ceiling |",
        "|---|---|---|---|---|",
    ]
    if r.ceiling:
        rows.append(f"| ceiling: consume → produce pass-through ({r.ceiling.count:,} records) | "
                    f"{_rate(r.ceiling.rate)} | 100 % | | |")  # fmt: skip
    if r.floor:
        rows.append(f"| Faust floor: bare agent draining the requests ({r.floor.count:,}) | "
                    f"{_rate(r.floor.rate)} | {_ratio(r.floor.rate, ceiling)} | | |")  # fmt: skip
    for ing in r.ingest:
        what = "one `Future` per record" if ing.path == "single" else "batched records (`schedule_many`)"
        if ing.available and ing.rate:
            ours = f"{_rate(ing.rate)}"
            ratio = _ratio(ing.rate, ceiling)
        else:
            ours, ratio = (ing.note or "not available"), "—"
        zadd = r.redis_zadd_rate if ing.path == "batched" else 0.0
        theirs = f"{_rate(zadd)} (pipelined ZADD) | {_ratio(zadd, ceiling)}" if zadd else " | "
        rows.append(f"| ingest, {what} ({ing.timers:,} timers) | {ours} | {ratio} | {theirs} |")
    for workload in ("hot-second", "spread", "capacity-hot"):
        pair = (r.fire(OURS, workload), r.fire(REDIS, workload))
        known = [f for f in pair if f is not None]
        if not known:
            continue
        title = _workload_title(known[0])
        cells = []
        for fire in pair:
            cells += [_rate(fire.fire_rate), _ratio(fire.fire_rate, ceiling)] if fire else ["—", "—"]
        rows.append(f"| fire, {title} | {' | '.join(cells)} |")
    return rows


def lateness_table(r: Results) -> list[str]:
    rows = [
        "| workload | system | received | p50 ms | p99 ms | max ms | early | p99 at dispatch ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fire in r.fires:
        late = fire.lateness
        rows.append(
            f"| {_workload_title(fire)} | {fire.system} | {late.received:,} of {late.expected:,} | "
            f"{_ms(late.p50_ms)} | {_ms(late.p99_ms)} | {_ms(late.max_ms)} | {late.early} | "
            f"{_ms(late.fired_p99_ms)} |"
        )
    return rows


def capacity_table(r: Results) -> list[str]:
    rows = [
        "| system | pending | memory before → peak → after | memory per pending timer | disk | "
        "disk per timer | load time |",
        "|---|---|---|---|---|---|---|",
    ]
    for cap in r.capacity:
        rows.append(
            f"| {cap.system} | {cap.pending:,} | {_mb(cap.rss_before)} → {_mb(cap.rss_peak)} → "
            f"{_mb(cap.rss_after)} | {_per_timer(cap)} | {_mb(cap.disk_bytes)} | "
            f"{cap.disk_per_timer:,.0f} B | {cap.load_seconds:,.1f} s |"
        )
    return rows


def _per_timer(cap: Capacity) -> str:
    how = "used_memory" if cap.used_memory_delta is not None else "RSS growth"
    return f"{cap.memory_per_timer:,.0f} B ({how})"


def targets_section(r: Results) -> list[str]:
    rows = ["| target | measured | verdict |", "|---|---|---|"]
    profiled = {p.phase: p for p in r.profiles}
    missed_profiles = []
    for v in evaluate(r):
        verdict = v.status + (f", {v.gap}" if v.gap else "")
        rows.append(f"| {v.target} | {v.measured} | **{verdict}** |")
        if v.status == MISSED and v.phase in profiled and profiled[v.phase].top_self:
            missed_profiles.append((v.target, profiled[v.phase]))
    lines = rows
    if missed_profiles:
        lines += ["", "Where the worker's CPU went during the missed targets (py-spy):", ""]
        for target, prof in missed_profiles:
            top = "; ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_self[:4])
            ours = "; ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_ours[:4])
            lines.append(f"- {target} — phase `{prof.phase}`: own time {top}; our code on the stack {ours}")
    return lines


def _clearly_more(a: float, b: float, floor: float = 0.0) -> bool:
    """``a`` beats ``b`` by more than run-to-run noise: 5 %, and at least ``floor``."""
    return a - b > max(0.05 * abs(b), floor)


def redis_ahead_section(r: Results) -> list[str]:
    """Where the baseline beats us by more than noise, with the reason."""
    lines = []
    zadd = r.redis_zadd_rate
    batched = r.ingest_of("batched")
    best_ingest = max((i.rate for i in r.ingest if i.available), default=0.0)
    if zadd and _clearly_more(zadd, best_ingest):
        lines.append(f"- **Accepting timers**: {zadd:,.0f}/s by ZADD vs our best {best_ingest:,.0f}/s "
                     f"({'batched' if batched and batched.rate == best_ingest else 'single records'}): "
                     f"{WHY_REDIS_AHEAD['ingest']}.")  # fmt: skip
    for workload in ("hot-second", "spread", "capacity-hot"):
        ours, redis = r.fire(OURS, workload), r.fire(REDIS, workload)
        if ours and redis and _clearly_more(redis.fire_rate, ours.fire_rate):
            lines.append(f"- **Fire rate, {_workload_title(ours)}**: Redis {redis.fire_rate:,.0f}/s vs ours "
                         f"{ours.fire_rate:,.0f}/s: {WHY_REDIS_AHEAD['fire']}.")  # fmt: skip
    for fire in r.fires:
        if fire.system != OURS or fire.workload.startswith("precise"):
            continue
        redis = r.fire(REDIS, fire.workload)
        if redis and _clearly_more(fire.lateness.p99_ms, redis.lateness.p99_ms, floor=10.0):
            gap = fire.lateness.p99_ms - redis.lateness.p99_ms
            if gap > SLOW_DISPATCH_MS:
                why = (
                    f"{WHY_REDIS_AHEAD['slow-dispatch']} (p99 at dispatch, by the dispatcher's own clock: "
                    f"{fire.lateness.fired_p99_ms:,.0f} ms vs {redis.lateness.fired_p99_ms:,.0f} ms, so the "
                    f"delay is in the worker, not in delivery); each fired timer also costs us more "
                    "(see the fire rates above)"
                )
            else:
                why = WHY_REDIS_AHEAD["tick-path"]
            lines.append(
                f"- **Lateness p99, {_workload_title(fire)}**: Redis {redis.lateness.p99_ms:,.0f} ms "
                f"vs ours {fire.lateness.p99_ms:,.0f} ms: {why}."
            )
    return lines or ["- Nowhere in this run."]


def profiles_section(r: Results) -> list[str]:
    lines = []
    for prof in r.profiles:
        if not prof.top_self:
            lines.append(f"- `{prof.phase}`: {prof.note or 'no samples'}")
            continue
        top = ", ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_self[:6])
        ours = ", ".join(f"`{fn}` {pct:.0f} %" for fn, pct in prof.top_ours[:5])
        lines.append(f"- `{prof.phase}` ({prof.samples:,} samples): own time: {top}")
        if ours:
            lines.append(f"  - our code, time on the stack: {ours}")
    return lines or ["- Not profiled in this run."]


def plot_lateness(r: Results, path: Path) -> None:
    workloads = list(dict.fromkeys(f.workload for f in r.fires))
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 2.6 * max(len(workloads), 1)), squeeze=False)
    for ax, workload in zip(axes[:, 0], workloads, strict=True):
        for fire in (f for f in r.fires if f.workload == workload):
            if fire.arrivals is None or fire.arrivals.count == 0:
                continue
            late = np.sort(fire.arrivals.received_ms - fire.arrivals.due_ms)
            share = np.arange(1, late.size + 1) / late.size
            ax.plot(late, share, color=COLORS.get(fire.system), label=f"{fire.system}")
            ax.axvline(fire.lateness.p99_ms, color=COLORS.get(fire.system), linestyle=":", linewidth=1)
        ax.set_title(_workload_title(next(f for f in r.fires if f.workload == workload)), fontsize=10)
        ax.set_xlabel("lateness: received − due (ms); dotted: p99")
        ax.set_ylabel("share of timers")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_fire_rate(r: Results, path: Path) -> None:
    workloads = list(dict.fromkeys(f.workload for f in r.fires))
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 2.6 * max(len(workloads), 1)), squeeze=False)
    for ax, workload in zip(axes[:, 0], workloads, strict=True):
        for fire in (f for f in r.fires if f.workload == workload):
            if fire.series_t:
                ax.step(fire.series_t, fire.series_rate, where="post", color=COLORS.get(fire.system),
                        label=fire.system)  # fmt: skip
        ax.set_title(_workload_title(next(f for f in r.fires if f.workload == workload)), fontsize=10)
        ax.set_xlabel("seconds since the first timers became due (hot second: its tick)")
        ax.set_ylabel("callbacks/s")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
        "- **Lateness** = receive time − `kt-due-ms`, taken by a separate collector process "
        f"(confluent-kafka, `assign()`, `fetch.wait.max.ms={FETCH_WAIT_MS}`) once per fetched batch; "
        "the column *at dispatch* uses `kt-fired-ms` instead. Clock: the wall clock (`CLOCK_REALTIME`) "
        "of this one machine, read by the load generator (due), the dispatcher (fired) and the "
        "collector (received).",
        "- **Capacity**: a fresh worker loaded with far-future timers; memory is the resident size of the "
        "worker process tree (sampled every 0.5 s, peak shown), disk its data directory (allocated blocks). "
        "For Redis, memory per timer is the growth of `used_memory` (INFO memory).",
        "- **Redis baseline** (`bench/redis_baseline.py`): ZADD pipelined (10 × 500 members per round trip), "
        "member = the serialized `Future`; a poller process on every second: ZRANGEBYSCORE … LIMIT 10000 → "
        "produce (the worker's producer settings) → flush → one ZREM per chunk; hiredis parser; "
        "`redis-server` without persistence (faster than any durable setup, and it loses timers on restart).",
        "- **Profiles**: py-spy sampling the worker at 50 Hz without pausing it, per measurement.",
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


def write(r: Results, out_dir: Path) -> Path:
    """Write ``BENCHMARKS.md`` and the plots under ``out_dir``; return the report's path."""
    plots = out_dir / PLOT_DIR
    plots.mkdir(parents=True, exist_ok=True)
    if r.fires:
        plot_lateness(r, plots / "lateness.png")
        plot_fire_rate(r, plots / "fire-rate.png")
    r.save(plots / "results.json")
    machine = [f"| {k} | {v} |" for k, v in r.machine.items()]
    versions = [f"| {k} | {v} |" for k, v in r.versions.items()]
    precise = "" if r.precise_available else (
        "\nPrecise mode (`TIMERS_PRECISE=1`) is **not available** in this build of the worker: "
        "not measured.\n"
    )  # fmt: skip
    lines = [
        "# Benchmarks",
        "",
        f"Profile **{r.profile}**, run on {r.started} in {r.duration_s / 60:.1f} min: `{r.command}`. "
        "Every figure below comes from this one run, on one broker and one machine; ratios are to the "
        "pass-through ceiling measured in the same run. Each figure is one measurement, not a median: "
        "compare runs before trusting a difference of a few percent.",
        "",
        "Regenerate: `make bench` (profile quick, under 5 minutes), `make bench-full` (1 M-timer hot "
        "second, 10 M pending), either against any Kafka with "
        "`KAFKA_BOOTSTRAP_SERVERS=host:9092 make bench`.",
        "",
        "## Results",
        "",
        sizes_line(r),
        "",
        "### Throughput",
        "",
        *throughput_table(r),
        "",
        "### Lateness",
        "",
        *lateness_table(r),
        precise,
        "### Capacity",
        "",
        *capacity_table(r),
        "",
        "## Targets",
        "",
        *targets_section(r),
        "",
        "## Where Redis is ahead of us, and why",
        "",
        *redis_ahead_section(r),
        "",
        "## Plots",
        "",
        f"![Lateness distribution per workload]({PLOT_DIR}/lateness.png)",
        "",
        f"![Fire rate over time]({PLOT_DIR}/fire-rate.png)",
        "",
        "## How it is measured",
        "",
        *method_section(r),
        "",
        "## Where the worker's time goes (py-spy, own time per function)",
        "",
        *profiles_section(r),
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
    notes = list(r.notes)
    for fire in r.fires:
        notes += [f"{fire.system}, {_workload_title(fire)}: {n}" for n in fire.notes]
    for cap in r.capacity:
        notes += [f"{cap.system}, capacity: {n}" for n in cap.notes]
        if cap.broker_rss_delta is not None:
            notes.append(
                f"{cap.system}, capacity: the embedded broker grew by {_mb(cap.broker_rss_delta)} while the "
                f"timers were loaded (requests, changelog and events are kept in Tansu's memory; a Kafka "
                f"cluster keeps them on its disks)"
            )
    notes += [f"{i.path} ingest: {i.note}" for i in r.ingest if i.note]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    if r.errors:
        lines += ["## Errors (measurements that failed)", "", *[f"- {e}" for e in r.errors], ""]
    path = out_dir / "BENCHMARKS.md"
    path.write_text("\n".join(lines))
    return path
