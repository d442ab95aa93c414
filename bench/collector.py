"""The receiver of a workload's callbacks: records due, fired and receive time of each, and
its ``kt-id`` (hashed), so that a timer received twice shows.

It runs as its own process (``python -m bench.collector``), so its receive times
never wait for the load generator to release the GIL. All three times are epoch
milliseconds from the wall clock (``CLOCK_REALTIME``) of this one machine: due
times are set by the load generator, ``kt-fired-ms`` by the dispatcher (worker or
Redis poller), receive times here, once per fetched batch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.cluster import PARTITIONS, REPO, BenchError, Broker, exit_with_parent
from bench.stats import Ints
from ktimers.config import CommonConfig
from ktimers.shutdown import StopFlag
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID

#: Tansu holds every fetch for its whole max wait, even when data is there (STACK.md):
#: receive times include up to this much broker hold (ms).
FETCH_WAIT_MS = 5
READY = "collector ready"


@dataclass(frozen=True)
class Arrivals:
    """One workload's callbacks as received: parallel arrays of epoch milliseconds."""

    due_ms: Ints
    fired_ms: Ints
    received_ms: Ints
    #: Each callback's ``kt-id``, hashed: a repeat has the hash of a timer received before.
    ids: Ints

    @property
    def count(self) -> int:
        return int(self.received_ms.size)


def _header(headers: Sequence[Sequence[str | bytes | None]], name: str) -> bytes:
    """The value of header ``name`` (b"" if none): the kt-* headers come last and win over a
    user's header of the same name."""
    for pair in reversed(headers):
        value = pair[1]
        if pair[0] == name and isinstance(value, bytes) and value:
            return value
    return b""


def collect(topic: str, partitions: int, expect: int, deadline: float, out: Path) -> int:
    """Read ``topic`` from the beginning until ``expect`` timers' callbacks (a repeat counts
    once) or epoch second ``deadline``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    stop = StopFlag()
    stop.install()
    exit_with_parent()
    consumer = Consumer(
        {
            **CommonConfig.from_env().kafka.librdkafka(),
            # assign() needs no group (joining one takes seconds on Tansu); nothing is committed.
            "group.id": f"bench-collector-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.queue.backoff.ms": 10,
        }
    )
    due, fired, received, ids = array("q"), array("q"), array("q"), array("q")
    seen: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        consumer.consume(1, timeout=0.01)  # connect before saying we are ready
        print(READY, flush=True)
        while len(seen) < expect and time.time() < deadline and not stop.requested:
            # consume(n, timeout) waits out its timeout unless n records came: a trickle of
            # callbacks (precise mode) would be stamped up to that late. poll() returns with
            # the first record; the rest already fetched are taken without waiting. Stamped
            # after both: a record taken by the second call may have come after the first.
            first = consumer.poll(0.05)
            if first is None:
                continue
            batch = [first, *consumer.consume(10_000, timeout=0)]
            now_ms = time.time_ns() // 1_000_000
            for msg in batch:
                if msg.error() is not None:
                    continue
                headers = list(msg.headers() or [])
                due.append(int(_header(headers, H_DUE_MS) or 0))
                fired.append(int(_header(headers, H_FIRED_MS) or 0))
                received.append(now_ms)
                # This process's hash: compared only with this run's (hash(b"") is 0).
                ids.append(timer := hash(_header(headers, H_ID)))
                seen.add(timer)
    finally:
        consumer.close()
    np.save(out, np.array([due, fired, received, ids], dtype=np.int64).reshape(4, -1))
    return 0


class Collector:
    """Parent side: start the collector process, wait until it listens, take its arrivals."""

    def __init__(self, broker: Broker, topic: str, expect: int, out: Path) -> None:
        if out.suffix != ".npy":
            raise ValueError(f"{out}: the collector writes .npy files")
        self.broker, self.topic, self.expect, self.out = broker, topic, expect, out
        self._process: subprocess.Popen[str] | None = None
        self._deadline = 0.0

    def start(self, deadline: float) -> Collector:
        """Start listening; the collector gives up at epoch second ``deadline``."""
        self._deadline = deadline
        argv = [
            sys.executable,
            "-m",
            "bench.collector",
            self.topic,
            str(self.expect),
            str(deadline),
            str(self.out),
        ]
        self._process = subprocess.Popen(  # noqa: S603 - our interpreter and module
            argv, env=self.broker.child_env(keep_tuning=False), cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None  # noqa: S101 - PIPE above
        line = self._process.stdout.readline()
        if READY not in line:
            self.stop()
            raise BenchError(f"callback collector for {self.topic} did not start (said {line!r})")
        return self

    def finish(self) -> Arrivals:
        """Wait until it has everything or its deadline passed; return what arrived."""
        if self._process is None:
            raise BenchError("collector not started")
        try:
            self._process.wait(timeout=max(0.0, self._deadline - time.time()) + 30)
        except subprocess.TimeoutExpired:
            self.stop()
        if self._process.returncode != 0 or not self.out.exists():
            raise BenchError(f"callback collector for {self.topic} failed ({self._process.returncode})")
        due, fired, received, ids = np.load(self.out)
        return Arrivals(due, fired, received, ids)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.collector", description=__doc__)
    parser.add_argument("topic")
    parser.add_argument("expect", type=int)
    parser.add_argument("deadline", type=float, help="epoch seconds")
    parser.add_argument("out", type=Path, help=".npy: due, fired, received (epoch ms), id hashes")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    args = parser.parse_args(argv)
    return collect(args.topic, args.partitions, args.expect, args.deadline, args.out)


if __name__ == "__main__":
    sys.exit(main())
