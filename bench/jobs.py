"""``make bench-jobs``: how fast ``timers-compact`` compacts a large request log with 1, 2 and 4 Spark tasks.

``python -m bench.jobs [--records N] [--masters local[1],local[2],local[4]] [--out DOCS]``

Writes N request records (default 10 M; the workload of :mod:`bench.joblog`:
80 % new timers, 10 % reschedules, 10 % cancels, a FIRED event for every fifth)
to a fresh topic set on the embedded broker (or ``KAFKA_BOOTSTRAP_SERVERS``), then
compacts it once per master, each in a fresh SparkSession, and reports for each:
request rows per second of the whole job (plan, read, decode, classify, count,
write the Parquet snapshot; the SparkSession start excluded), the CPU seconds the
job took in every process (driver, JVM, Python workers), and the load average:
the machine may be shared, and wall-clock rates only mean something next to it.
The figures go to the ``jobs`` part of ``docs/bench/results.json``; docs/BENCHMARKS.md
shows them.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.cluster import REPO, instance_env, open_broker, run_dir
from bench.joblog import PARTITIONS, fill
from bench.render import render
from bench.results import Job, JobsRun, store
from futures.jobs.compact import CompactOptions, run
from futures.jobs.config import JobConfig
from futures.jobs.runner import LOCAL_SHUFFLE_PARTITIONS
from futures.jobs.session import SparkSettings, build_session
from ktimers.topics import create_topics

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int | None = None, without: int | None = None) -> float:
    """CPU seconds (user + system) of ``root`` (default: this process) and every descendant,
    including the children they have reaped (Spark's Python workers), except the tree of ``without``."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, ..., utime (14th field of the line), stime, cutime, cstime.
        ppid = int(fields[1])
        cpu = sum(int(x) for x in fields[11:15]) / _TICK
        stats[int(entry)] = (ppid, cpu)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid == without:
            continue
        total += stats.get(pid, (0, 0.0))[1]
        todo += children.get(pid, [])
    return total


def measure(config: JobConfig, master: str, broker: int | None) -> Job:
    """One compaction on ``master``; ``broker``: the pid of an embedded broker, whose CPU is not the job's."""
    settings = SparkSettings(master=master, progress=False, shuffle_partitions=LOCAL_SHUFFLE_PARTITIONS)
    spark = build_session(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-jobs-") as out:
            load_before = os.getloadavg()
            cpu_before = tree_cpu_s(without=broker)
            result = run(spark, config, CompactOptions(out=f"{out}/snapshot"))
            cpu = tree_cpu_s(without=broker) - cpu_before
            load_after = os.getloadavg()
    finally:
        spark.stop()
    return Job(master, result.counts.read, result.seconds, cpu, list(load_before), list(load_after))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--masters", default="local[1],local[2],local[4]", help="comma-separated")
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs", help="docs directory to update (default: docs)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with open_broker(run_dir("jobs")) as broker:  # the embedded broker's log goes there
        env = {**os.environ, **broker.env, **instance_env("jobs", PARTITIONS)}
        config = JobConfig.from_env(env)
        create_topics(config.common)
        started = time.monotonic()
        fill(config.common, args.records)
        fill_s = time.monotonic() - started
        print(f"wrote {args.records:,} request records in {fill_s:.1f}s", flush=True)
        results = []
        embedded = broker.embedded.process.pid if broker.embedded is not None else None
        for master in args.masters.split(","):
            job = measure(config, master.strip(), embedded)
            print(
                f"{job.master}: {job.rows:,} rows in {job.seconds:.1f} s, {job.cpu_s:.0f} s of CPU",
                flush=True,
            )
            results.append(job)
    run = JobsRun(
        command=f"python -m bench.jobs --records {args.records} --masters {args.masters}",
        when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cores=os.cpu_count() or 0,
        records=args.records,
        partitions=PARTITIONS,
        fill_s=fill_s,
        jobs=results,
    )
    store(args.out, "jobs", run)
    print(f"written: {', '.join(map(str, render(args.out)))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
