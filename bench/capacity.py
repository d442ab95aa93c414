"""``make bench-capacity``: one worker's memory and hot-second rate as pending timers grow to 10 M.

``python -m bench.capacity [--pending 1000000,10000000] [--hot 100000] [--repeat 2] [--out PATH]``

One embedded broker (or ``KAFKA_BOOTSTRAP_SERVERS``), one worker. First a hot second
with nothing else pending; then far-future timers are loaded (batched requests) up to each
``--pending`` total in turn, and at each a hot second of ``--hot`` timers fires ``--repeat``
times. Reported per step: worker RSS, RocksDB size, the broker's RSS, the fire rate and how
it compares with the rate at the first step, and the load average (the machine may be shared:
rates mean something only next to it and next to each other, measured in the same run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.cluster import ServiceStack, open_broker, service_stack
from bench.fire import FireContext, scheduled
from bench.service import KafkaTimers
from bench.workload import UNFIRED_TOPIC, far_future, load

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Step:
    pending: int
    load_s: float = 0.0
    rss_mb: float = 0.0
    data_gb: float = 0.0
    broker_gb: float | None = None
    rates: list[float] = field(default_factory=list)
    last_ms: list[float] = field(default_factory=list)
    early: int = 0
    load_avg: str = ""


def _load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def measure(targets: list[int], hot: int, repeat: int, work: Path) -> list[Step]:
    steps: list[Step] = []
    with open_broker(work) as broker:
        ctx = FireContext(broker, work, tail_timeout_s=60.0, margin_s=2.0)
        with service_stack(broker, work, "capacity") as stack:
            system = KafkaTimers(stack, batched=True, load_rate=40_000.0)
            pending = 0
            for target in [0, *targets]:
                step = Step(target)
                if target > pending:
                    # The last hot second's last piece may still be being deleted after its callbacks
                    # arrived: counted now, it would be counted twice (and the wait below run out).
                    base = _settled_pending(stack, pending)
                    started = time.monotonic()
                    scheduler = system.scheduler()
                    try:
                        load(scheduler, UNFIRED_TOPIC, far_future(target - pending))
                    finally:
                        scheduler.close()
                    reached = stack.wait_metric(
                        "timers_pending", base + target - pending, target / 10_000 + 120
                    )
                    step.pending = pending + int(reached - base)
                    step.load_s = time.monotonic() - started
                    pending = target
                step.load_avg = _load_avg()
                for i in range(repeat):
                    fire = scheduled(ctx, system, f"hot-{target}-{i}", hot, 1.0, 0.1)
                    step.rates.append(fire.fire_rate)
                    step.last_ms.append(fire.lateness.max_ms)
                    step.early += fire.lateness.early
                    print(
                        f"{step.pending:,} pending: hot second of {hot:,} at {fire.fire_rate:,.0f}/s, "
                        f"last {fire.lateness.max_ms:,.0f} ms after due",
                        flush=True,
                    )
                step.rss_mb = stack.worker_rss_bytes() / 1e6
                step.data_gb = stack.data_bytes() / 1e9
                broker_rss = broker.rss_bytes()
                step.broker_gb = None if broker_rss is None else broker_rss / 1e9
                step.load_avg += " → " + _load_avg()
                steps.append(step)
    return steps


def _settled_pending(stack: ServiceStack, expected: int, timeout_s: float = 30.0) -> float:
    """``timers_pending`` once it is down to ``expected`` (the far-future timers loaded so far), or
    what it is after ``timeout_s``: fired timers leave the tables a moment after their callbacks."""
    deadline = time.monotonic() + timeout_s
    value = stack.metric_sum("timers_pending")
    while value > expected and time.monotonic() < deadline:
        time.sleep(0.2)
        value = stack.metric_sum("timers_pending")
    return value


def report(steps: list[Step], hot: int, command: str) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Capacity: one worker as pending timers grow",
        "",
        f"Run on {when}: `{command}`, on {os.cpu_count()} cores. One worker; far-future timers loaded in "
        f"batched requests up to each size, then a hot second of {hot:,} timers fired at each size "
        f"({len(steps[0].rates)} times; median, then each run). Rate: callbacks per second of the hot "
        "second, as `make bench` measures it. Load: the 1/5/15-minute load average before → after the "
        "hot seconds; above the core count, other processes shared the machine (right after a large "
        "load, RocksDB is still compacting what it took in, in the worker's own background threads).",
        "",
        "| pending | loaded in | worker RSS | RocksDB on disk | broker RSS | hot second "
        "| vs. the size before | last callback after due | early | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    before: float | None = None
    for s in steps:
        rate = statistics.median(s.rates)
        ratio = "—" if before is None else f"{rate / before:.0%}"
        before = rate
        runs = ", ".join(f"{r:,.0f}" for r in s.rates)
        broker = "—" if s.broker_gb is None else f"{s.broker_gb:.1f} GB"
        loaded = "—" if not s.load_s else f"{s.load_s:.0f} s"
        last = ", ".join(f"{m:,.0f}" for m in s.last_ms)
        lines.append(
            f"| {s.pending:,} | {loaded} | {s.rss_mb:,.0f} MB | {s.data_gb:.2f} GB | {broker} "
            f"| **{rate:,.0f}/s** ({runs}) | {ratio} | {last} ms | {s.early} | {s.load_avg} |"
        )
    lines += ["", "Regenerate: `make bench-capacity` (`ARGS='--pending 1000000'` for a quicker run).", ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class Row:
    """One size of a capacity report, read back from its Markdown (:func:`read_report`)."""

    pending: int
    rss_mb: float
    #: The hot second's rate as a share of the size before's (None for the first size).
    vs_before: float | None
    #: When the report was made ("2026-11-24 10:13 UTC").
    when: str


def read_report(text: str) -> list[Row]:
    """The rows of a report :func:`report` wrote (``make bench`` judges the 10 M targets by them)."""
    run = next((line for line in text.splitlines() if line.startswith("Run on ")), "")
    when = run[len("Run on ") :].split(": `", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not cells[0].replace(",", "").isdigit():
            continue
        share = cells[6].rstrip("%")
        rows.append(
            Row(
                pending=int(cells[0].replace(",", "")),
                rss_mb=float(cells[2].removesuffix(" MB").replace(",", "")),
                vs_before=float(share) / 100 if share.isdigit() else None,
                when=when,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", default="1000000,10000000", help="pending totals, comma-separated")
    parser.add_argument("--hot", type=int, default=100_000, help="timers of each hot second")
    parser.add_argument("--repeat", type=int, default=2, help="hot seconds at each size")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "capacity.md")
    parser.add_argument(
        "--work", type=Path, default=None, help="logs and worker data (default: run/capacity-<time>)"
    )
    args = parser.parse_args(argv)
    targets = sorted({int(x) for x in args.pending.split(",") if x.strip()})
    if not targets or targets[0] < 1 or args.hot < 1 or args.repeat < 1:
        parser.error("--pending needs positive sizes; --hot and --repeat at least 1")
    work = args.work or REPO / "run" / f"capacity-{time.strftime('%Y%m%d-%H%M%S')}"
    steps = measure(targets, args.hot, args.repeat, work)
    command = f"python -m bench.capacity --pending {args.pending} --hot {args.hot} --repeat {args.repeat}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(steps, args.hot, command))
    print(f"report: {args.out}; logs and worker data: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
