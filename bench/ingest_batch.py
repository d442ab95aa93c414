"""Batched ingest: how many timers per second one worker accepts from ``FutureBatch`` records.

    python -m bench.ingest_batch [--timers 300000] [--batch-size 1000] [--profile worker.prof]

Starts the embedded broker (or uses ``KAFKA_BOOTSTRAP_SERVERS``), the service's
topics and one worker; then schedules ``--timers`` timers due far in the future
with ``TimerClient.schedule_many`` and samples the worker's
``timers_scheduled_total`` until all are accepted. The requests are produced
before the worker starts, so it drains them as fast as it can; prints the
worker's rate (first timer accepted to last) and the client's. ``--profile FILE``
runs the worker under cProfile (``python -m cProfile -o FILE``); read it with
``python -m pstats FILE``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from futures.client import TimerClient, TimerSpec
from ktimers.broker import free_port, start_broker
from ktimers.config import CommonConfig
from ktimers.topics import create_topics

READY = "timer table ready"
FAR_FUTURE_S = 10 * 365 * 86400


@contextmanager
def broker_env(work: Path) -> Iterator[dict[str, str]]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield {}
        return
    broker = start_broker(log_path=str(work / "broker.log"))
    try:
        yield broker.env()
    finally:
        broker.stop()


@contextmanager
def worker(env: dict[str, str], work: Path, profile: str | None) -> Iterator[subprocess.Popen[bytes]]:
    log = work / "worker.log"
    args = (
        ["-m", "cProfile", "-o", profile, "-m", "futures.worker.main"]
        if profile
        else ["-m", "futures.worker.main"]
    )
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, *args], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 120
        while READY not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def scheduled_total(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310
    return sum(
        float(line.rpartition(" ")[2])
        for line in body.splitlines()
        if line.startswith("timers_scheduled_total")
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(timers: int, batch_size: int, profile: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="ingest-batch-") as tmp, broker_env(Path(tmp)) as kafka_env:
        work = Path(tmp)
        suffix = uuid.uuid4().hex[:8]
        port = free_port()
        env = {
            **kafka_env,
            "TIMERS_TOPIC_OSCILLATOR": f"oscillator-{suffix}",
            "TIMERS_TOPIC_REQUEST": f"timer-request-{suffix}",
            "TIMERS_TOPIC_EVENTS": f"timer-events-{suffix}",
            "TIMERS_TOPIC_DLQ": f"timer-request-dlq-{suffix}",
            "TIMERS_APP_ID": f"timers-{suffix}",
            "TIMERS_DATA_DIR": str(work / "data"),
            "TIMERS_WEB_PORT": str(port),
        }
        common = CommonConfig.from_env({**os.environ, **env})
        create_topics(common)
        due = time.time() + FAR_FUTURE_S
        specs = [TimerSpec("ingest-bench", f"k{i}", b"x" * 100, at=due + i / 1000) for i in range(timers)]
        # Every request is waiting before the worker starts: it drains them as fast as it can.
        started = time.monotonic()
        with TimerClient(common, producer_config={"linger.ms": 20}) as client:
            client.schedule_many(specs, batch_size=batch_size)
        produced = time.monotonic() - started
        with worker(env, work, profile) as process:
            samples: list[tuple[float, float, float]] = []  # (time, accepted, worker CPU seconds)
            deadline = time.monotonic() + max(120.0, timers / 2000)
            while not samples or samples[-1][1] < timers:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {samples[-1][1]:.0f} of {timers} accepted in time")
                samples.append((time.monotonic(), scheduled_total(port), cpu_seconds(process.pid)))
                time.sleep(0.05)
        first = next(i for i, (_, accepted, _) in enumerate(samples) if accepted > 0)
        # The sample before the first accepted timer bounds the start from below.
        start, cpu_start = samples[max(first - 1, 0)][0], samples[max(first - 1, 0)][2]
        end, _, cpu_end = samples[-1]
        print(
            f"{timers:,} timers in batches of {batch_size}: the client produced them in {produced:.2f}s "
            f"({timers / produced:,.0f}/s); one worker accepted them in {end - start:.2f}s = "
            f"{timers / (end - start):,.0f} timers/s, its CPU busy "
            f"{(cpu_end - cpu_start) / (end - start):.0%} "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timers", type=int, default=300_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--profile", help="write the worker's cProfile stats to this file")
    args = parser.parse_args()
    measure(args.timers, args.batch_size, args.profile and str(Path(args.profile).resolve()))


if __name__ == "__main__":
    main()
