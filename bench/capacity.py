"""``make bench-capacity``: one worker's memory and hot-second rate as pending timers grow to 10 M.

``python -m bench.capacity [--pending 1000000,10000000] [--hot 100000] [--repeat 2] [--out DOCS]``

One embedded broker (or ``KAFKA_BOOTSTRAP_SERVERS``), one worker. First a hot second
with nothing else pending; then far-future timers are loaded (batched requests) up to each
``--pending`` total in turn, and at each a hot second of ``--hot`` timers fires ``--repeat``
times. Reported per step: the worker's RSS (its peak during the hot seconds, and at rest after
them), RocksDB size, the broker's RSS, the fire rate and how it compares with the rate at the
size before, and the load average (the machine may be shared: rates mean something only next to
it and next to each other, measured in the same run). The
figures go to the ``capacity`` part of ``docs/bench/results.json``; docs/BENCHMARKS.md shows them.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.cluster import REPO, ServiceStack, open_broker, run_dir, service_stack
from bench.fire import FireContext, scheduled
from bench.render import render
from bench.results import CapacityRun, CapacityStep, store
from bench.sampler import Sampler
from bench.service import KafkaTimers
from bench.workload import UNFIRED_TOPIC, far_future, load

#: How long the worker is left idle after a size's hot seconds before its memory at rest is read (s).
REST_S = 3.0


def _load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def measure(targets: list[int], hot: int, repeat: int, work: Path) -> list[CapacityStep]:
    steps: list[CapacityStep] = []
    with open_broker(work) as broker:
        ctx = FireContext(broker, work, tail_timeout_s=60.0, margin_s=2.0)
        with service_stack(broker, work, "capacity") as stack:
            system = KafkaTimers(stack, batched=True, load_rate=40_000.0)
            pending = 0
            for target in [0, *targets]:
                step = CapacityStep(target)
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
                # Right after a large load RocksDB is still compacting it, on the CPU the hot second needs.
                step.compaction_owed_gb = stack.metric_sum("timers_table_compaction_pending_bytes") / 1e9
                with Sampler(lambda: float(stack.worker_rss_bytes()), 0.2) as rss:
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
                step.peak_rss_mb = max(rss.peak, stack.worker_rss_bytes()) / 1e6
                # At rest: the hot seconds' timers swept, and the worker idle long enough to have
                # handed back what they freed (futures/worker/malloc.py).
                _settled_pending(stack, pending)
                time.sleep(REST_S)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", default="1000000,10000000", help="pending totals, comma-separated")
    parser.add_argument("--hot", type=int, default=100_000, help="timers of each hot second")
    parser.add_argument("--repeat", type=int, default=2, help="hot seconds at each size")
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs", help="docs directory to update (default: docs)"
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="logs and worker data (default: run/capacity-<time>)"
    )
    args = parser.parse_args(argv)
    targets = sorted({int(x) for x in args.pending.split(",") if x.strip()})
    if not targets or targets[0] < 1 or args.hot < 1 or args.repeat < 1:
        parser.error("--pending needs positive sizes; --hot and --repeat at least 1")
    work = args.work or run_dir("capacity")
    steps = measure(targets, args.hot, args.repeat, work)
    run = CapacityRun(
        command=f"python -m bench.capacity --pending {args.pending} --hot {args.hot} --repeat {args.repeat}",
        when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cores=os.cpu_count() or 0,
        hot=args.hot,
        repeat=args.repeat,
        steps=steps,
    )
    store(args.out, "capacity", run)
    pages = render(args.out)
    print(f"written: {', '.join(map(str, pages))}; logs and worker data: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
