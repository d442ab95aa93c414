"""The Faust floor: a bare Faust agent draining the same `timer-request` records.

It consumes exactly as the worker's request agent does — ``noack_take`` batches of
``TIMERS_INGEST_BATCH_SIZE`` within ``TIMERS_INGEST_BATCH_WITHIN_S``, then an ack per
event — and does nothing with the events, so the gap between this rate and the
worker's ingest rate is the cost of our own work (parse, table, changelog, events).

Runs as its own Faust worker process (``python -m bench.faust_floor``) with the
worker's broker settings (the embedded profile's short fetch wait and timeouts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.cluster import PARTITIONS, REPO, BenchError, Broker, exit_with_parent
from bench.results import Throughput
from bench.stats import rise_rate
from futures.worker.config import WorkerConfig

TIMEOUT_S = 600.0


def run_agent(topic: str, expect: int, out: Path, data_dir: Path) -> None:
    import faust

    from futures.worker.app import _broker_url, _credentials

    config = WorkerConfig.from_env()
    kafka = config.common.kafka
    profile = kafka.settings
    app = faust.App(
        f"bench-floor-{uuid.uuid4().hex[:8]}",
        broker=_broker_url(kafka),
        broker_consumer=_broker_url(kafka, "tansu" if profile.short_fetch_wait else "kafka"),
        broker_credentials=_credentials(kafka),
        datadir=str(data_dir),
        topic_partitions=PARTITIONS,
        topic_replication_factor=profile.replication_factor,
        broker_session_timeout=profile.session_timeout_s,
        broker_heartbeat_interval=profile.heartbeat_s,
        broker_rebalance_timeout=profile.rebalance_timeout_s,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        topic_allow_declare=False,
    )
    source = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    @app.agent(source)
    async def drain(stream: Any) -> None:
        seen = 0
        samples: list[tuple[float, int]] = [(time.time(), 0)]
        # Faust's per-event stream, batched (the worker's own transport bypasses it).
        async for events in stream.noack_take(config.ingest_batch_size, 0.05):
            for event in events:
                await stream.ack(event)
            seen += len(events)
            samples.append((time.time(), seen))
            if seen >= expect and not out.exists():
                out.write_text(json.dumps({"samples": samples}))

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def measure(broker: Broker, topic: str, records: int, work_dir: Path) -> Throughput:
    """Drain ``records`` records of ``topic`` with the bare agent; events per second."""
    out = work_dir / f"floor-{uuid.uuid4().hex[:6]}.json"
    argv = [
        sys.executable,
        "-m",
        "bench.faust_floor",
        topic,
        str(records),
        str(out),
        str(work_dir / "floor-data"),
    ]
    with open(work_dir / "floor.log", "ab") as log:
        process = subprocess.Popen(  # noqa: S603 - our interpreter and module
            argv, env=broker.child_env(keep_tuning=False), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not out.exists():
            if process.poll() is not None:
                raise BenchError(f"Faust floor exited ({process.returncode}): see {work_dir / 'floor.log'}")
            if time.monotonic() > deadline:
                raise BenchError(f"Faust floor: {records} records not drained in {TIMEOUT_S:g}s")
            time.sleep(0.2)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    samples = [(float(t), float(n)) for t, n in json.loads(out.read_text())["samples"]]
    rate = rise_rate(samples, 0, records)
    return Throughput(
        name="faust-floor",
        count=records,
        rate=rate,
        seconds=records / rate if rate else 0.0,
        detail="bare Faust agent: noack_take batches + ack per event, as the worker's request agent",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faust_floor", description=__doc__)
    parser.add_argument("topic")
    parser.add_argument("expect", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    exit_with_parent()
    run_agent(args.topic, args.expect, args.out, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
