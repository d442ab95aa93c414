"""``python -m bench.ingest``: only the ingest measures of ``make bench``, beside pipelined ZADD.

One broker, one service instance: ingest through one ``Future`` per record, then through
batched records (the measures of :func:`bench.service.ingest`), then the Redis design's
pipelined ZADD of as many timers (:func:`bench.redis_baseline.measure_zadd_rate`) in the
same run, so the ratio holds on a busy machine. ``--profile-worker`` samples the worker
with py-spy during each measure (``profile-ingest-*.txt`` in the work dir). Nothing is
written to docs/.

Those measures send the requests while the worker takes them in, so on a small machine
the client's own rate bounds them (the batched client sends ~50-100 k timers/s on two
busy cores). ``--backlog`` measures what the worker alone drains: it stops the worker,
sends the requests, starts it again and reads the rate from its first timer accepted
to its last (its start is not counted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import service
from bench.cluster import ServiceStack, open_broker, run_dir, service_stack
from bench.profiling import Profiler
from bench.redis_baseline import RedisServer, measure_zadd_rate
from bench.results import Ingest
from bench.sampler import Sampler
from bench.stats import rise_rate
from bench.workload import UNFIRED_TOPIC, ClientScheduler, far_future, load


def drain(stack: ServiceStack, *, batched: bool, count: int, profiler: Profiler) -> Ingest:
    """Timers per second the worker accepts from ``count`` requests sent while it was stopped."""
    path = "batched" if batched else "single"
    if stack.worker is not None:
        stack.worker.stop()
    scheduler = ClientScheduler(stack.common, batched=batched)
    try:
        load(scheduler, UNFIRED_TOPIC, far_future(count))
    finally:
        scheduler.close()
    worker = stack.start_worker(wait=False)
    # A restarted worker counts from 0; readings fail until it serves its metrics.
    read = lambda: stack.metric_sum("timers_scheduled_total")  # noqa: E731
    with (
        Sampler(read, service.SAMPLE_S, until=count, timeout_s=max(120.0, count / 500)) as sampler,
        profiler.sample(worker.pid, f"drain-{path}"),
    ):
        sampler.wait()
    stack.check()
    if sampler.last < count:
        return Ingest(path, timers=count, note=f"only {sampler.last:.0f} accepted in time")
    return Ingest(path, timers=count, rate=rise_rate(sampler.samples, 0, count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__)
    parser.add_argument("--single", type=int, default=30_000, help="single-Future records (0: skip)")
    parser.add_argument("--batched", type=int, default=300_000, help="timers in batched records (0: skip)")
    parser.add_argument("--repeat", type=int, default=1, help="measure each path N times on one instance")
    parser.add_argument("--profile-worker", action="store_true", help="sample the worker with py-spy")
    parser.add_argument("--backlog", action="store_true", help="drain requests sent while stopped")
    parser.add_argument(
        "--work", type=Path, default=None, help="logs, worker data (default: run/ingest-<time>)"
    )
    args = parser.parse_args(argv)
    work = args.work or run_dir("ingest")
    work.mkdir(parents=True, exist_ok=True)
    profiler = Profiler(args.profile_worker, work)
    rates: dict[str, list[float]] = {"single": [], "batched": []}
    with open_broker(work) as broker:
        with service_stack(broker, work, "ingest") as stack:
            for _ in range(args.repeat):
                for path, count in (("single", args.single), ("batched", args.batched)):
                    if count:
                        measure = drain if args.backlog else service.ingest
                        ing = measure(stack, batched=path == "batched", count=count, profiler=profiler)
                        print(f"ingest {path}: {ing.rate:,.0f}/s {ing.note}", flush=True)
                        rates[path].append(ing.rate)
        server = RedisServer(work, durable=False)
        try:
            zadd = measure_zadd_rate(server, max(args.batched, 1))
        finally:
            server.stop()
    print(f"redis pipelined ZADD: {zadd:,.0f}/s", flush=True)
    for path, found in rates.items():
        for rate in found:
            print(f"ingest {path}: {rate:,.0f}/s = {100 * rate / zadd:.0f} % of ZADD", flush=True)
    for summary in profiler.summaries:
        print(f"-- {summary.phase}: {summary.samples} samples {summary.note}")
        for name, share in summary.top_self:
            print(f"   self {share:5.1f} %  {name}")
        for name, share in summary.top_ours:
            print(f"   ours {share:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
