"""The baseline a user would pick instead: delayed messages in a Redis sorted set.

The common "delayed messages with Redis" design, written to be fast, not a strawman:

* schedule: ``ZADD delayed <due ms> <message>``, pipelined (one round trip per
  thousand timers); the member is the serialized ``Future`` (callback topic, key,
  payload, id, due), so it is unique and self-contained.
* a poller process, once a second on the second (the schedule our oscillator ticks
  on): ``ZRANGEBYSCORE delayed -inf <now ms> LIMIT 0 10000`` → produce every
  callback through one confluent-kafka producer (idempotent, ``acks=all``, the
  worker's settings) → flush → one ``ZREM`` of the whole chunk; repeat until a
  chunk comes back short. Deleting after the flush makes it at-least-once, like
  ours. Replies are parsed by hiredis.
* Redis runs from Debian's ``redis-server`` on 127.0.0.1, a free port, in one of two
  setups: without persistence (no RDB, no AOF: the fastest it can be, and not
  durable), or durable with an append-only file fsynced every second
  (``--appendonly yes --appendfsync everysec``, in its own temporary directory), the
  fair comparison for a durable service: a crash loses at most the last second.

Callbacks carry the same ``kt-id``, ``kt-due-ms`` and ``kt-fired-ms`` headers as ours,
so one collector measures both.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import redis
from confluent_kafka import Producer

from bench.cluster import REPO, BenchError, Broker, disk_bytes, exit_with_parent, tree_rss_bytes
from bench.fire import FireContext, scheduled
from bench.results import REDIS, REDIS_AOF, Capacity
from bench.sampler import Sampler
from bench.workload import PAYLOAD, UNFIRED_TOPIC, callback_key, far_future, load
from futures.worker.kafka import producer_config
from ktimers.broker import free_port, wait_for_port
from ktimers.config import CommonConfig
from ktimers.shutdown import StopFlag
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, Future

KEY = "delayed"
ZADD_MEMBERS = 500  # members per ZADD command
PIPELINE = 10  # ZADD commands per round trip
CHUNK = 10_000  # timers per poll round (ZRANGEBYSCORE LIMIT, one ZREM)
POLL_INTERVAL_S = 1.0


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise BenchError("redis-server is not installed: run `make redis` (apt-get install -y redis-server)")
    return binary


def redis_version() -> str:
    out = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True, check=False)  # noqa: S603
    for part in out.stdout.split():
        if part.startswith("v="):
            return part[2:]
    return out.stdout.strip()


#: ``redis-server`` settings of the durable setup: every write appended to a file that is
#: fsynced once a second (no RDB snapshots, which would add fork pauses).
DURABLE_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec")


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1; stopped (and its AOF directory removed) by :meth:`stop`.

    ``durable``: append-only file, fsync every second, in a fresh temporary directory;
    otherwise no persistence at all.
    """

    def __init__(self, work_dir: Path, *, durable: bool = False) -> None:
        self.port = free_port()
        self.durable = durable
        #: Where the AOF lives (its own directory under the system's temporary path).
        self.data_dir = Path(tempfile.mkdtemp(prefix="bench-redis-aof-")) if durable else work_dir
        argv = [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        argv += list(DURABLE_ARGS) if durable else ["--appendonly", "no"]
        argv += ["--dir", str(self.data_dir), "--daemonize", "no"]
        log_name = "redis-aof.log" if durable else "redis.log"
        with open(work_dir / log_name, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
        try:
            wait_for_port("127.0.0.1", self.port, timeout_s=15)
        except Exception:
            self.stop()
            raise

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def used_memory(self) -> int:
        """Bytes Redis has allocated for data (``INFO memory`` ``used_memory``)."""
        info = self.client().info("memory")
        return int(info["used_memory"])

    def rss_bytes(self) -> int:
        return tree_rss_bytes(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.durable:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def member(topic: str, index: int, due_ms: int) -> bytes:
    future = Future(callBackTopic=topic, callBackKey=callback_key(index), callBack=PAYLOAD, due_ms=due_ms)
    future.id = uuid.uuid4().hex
    return future.SerializeToString()


class RedisScheduler:
    """Schedules timers with pipelined ZADDs (:class:`bench.workload.Scheduler`)."""

    def __init__(self, server: RedisServer, counter: list[int]) -> None:
        self._redis = server.client()
        self._counter = counter

    def schedule(self, topic: str, due_ms: Sequence[int], first_index: int) -> None:
        per_round_trip = ZADD_MEMBERS * PIPELINE
        for start in range(0, len(due_ms), per_round_trip):
            pipe = self._redis.pipeline(transaction=False)
            end = min(start + per_round_trip, len(due_ms))
            for first in range(start, end, ZADD_MEMBERS):
                chunk = due_ms[first : min(first + ZADD_MEMBERS, end)]
                mapping = {member(topic, first_index + first + i, due): due for i, due in enumerate(chunk)}
                pipe.zadd(KEY, mapping)
            pipe.execute()
            self._counter[0] += end - start

    def flush(self) -> None:
        """ZADD returned: the timers are in Redis already."""

    def close(self) -> None:
        self._redis.close()


class RedisDesign:
    """Redis + its poller process, for the fire workloads (:class:`bench.fire.System`)."""

    def __init__(self, server: RedisServer, poller: subprocess.Popen[bytes], load_rate: float) -> None:
        self.name = REDIS_AOF if server.durable else REDIS
        self.server, self.poller = server, poller
        self._accepted = [0]
        self._load_rate = load_rate

    def scheduler(self) -> RedisScheduler:
        return RedisScheduler(self.server, self._accepted)

    def accepted(self) -> int:
        return self._accepted[0]

    def load_rate(self) -> float:
        return self._load_rate

    def check(self) -> None:
        for name, process in (("redis-server", self.server.process), ("redis poller", self.poller)):
            if process.poll() is not None:
                raise BenchError(f"{name} exited ({process.returncode})")


def measure_zadd_rate(server: RedisServer, count: int) -> float:
    """Timers per second pipelined ZADDs take (plans the load of the fire workloads)."""
    scheduler = RedisScheduler(server, [0])
    started = time.perf_counter()
    scheduler.schedule(UNFIRED_TOPIC, [2**40 + i for i in range(count)], 0)
    rate = count / (time.perf_counter() - started)
    server.client().delete(KEY)
    return rate


@contextlib.contextmanager
def redis_design(broker: Broker, work_dir: Path, *, durable: bool, zadd_count: int) -> Iterator[RedisDesign]:
    """Redis (durable or not) and its poller, started and stopped around the block.

    Measures the ZADD rate with ``zadd_count`` timers first (the design's ingest).
    """
    server = RedisServer(work_dir, durable=durable)
    poller: subprocess.Popen[bytes] | None = None
    try:
        rate = measure_zadd_rate(server, zadd_count)
        with open(work_dir / f"{'redis-aof' if durable else 'redis'}-poller.log", "ab") as log:
            poller = subprocess.Popen(  # noqa: S603 - our interpreter and module
                [sys.executable, "-m", "bench.redis_baseline", str(server.port)],
                env=broker.child_env(keep_tuning=False),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        yield RedisDesign(server, poller, rate)
    finally:
        if poller is not None and poller.poll() is None:
            poller.terminate()
            try:
                poller.wait(timeout=20)
            except subprocess.TimeoutExpired:
                poller.kill()
                poller.wait()
        server.stop()


def capacity(design: RedisDesign, ctx: FireContext, *, pending: int, hot: int) -> Capacity:
    """``used_memory`` and RSS with ``pending`` timers in the set, then a hot second of ``hot``."""
    server = design.server
    used_before, rss_before = server.used_memory(), server.rss_bytes()
    started = time.monotonic()
    with Sampler(lambda: float(server.rss_bytes()), 0.5) as rss:
        scheduler = design.scheduler()
        try:
            load(scheduler, UNFIRED_TOPIC, far_future(pending))
        finally:
            scheduler.close()
    load_seconds = time.monotonic() - started
    rss_after = server.rss_bytes()
    result = Capacity(
        system=design.name,
        pending=pending,
        rss_before=rss_before,
        rss_peak=int(max(rss.peak, rss_after)),
        rss_after=rss_after,
        disk_bytes=disk_bytes(server.data_dir) if server.durable else 0,
        load_seconds=load_seconds,
        used_memory_delta=server.used_memory() - used_before,
        notes=[]
        if server.durable
        else ["no persistence configured: nothing on disk, and a restart loses every timer"],
    )
    result.hot = scheduled(ctx, design, "capacity-hot", hot, 1.0, 0.1)
    return result


# -- the poller process -------------------------------------------------------


def poll_once(client: redis.Redis, producer: Producer, now_ms: int) -> int:
    """Dispatch every timer due by ``now_ms``; return how many."""
    fired = 0
    while True:
        members: list[bytes] = client.zrangebyscore(KEY, "-inf", now_ms, start=0, num=CHUNK)  # type: ignore[assignment]
        if not members:
            return fired
        fired_ms = str(time.time_ns() // 1_000_000).encode()
        for raw in members:
            future = Future.FromString(raw)
            headers: list[tuple[str, str | bytes | None]] = [
                (H_ID, future.id.encode()),
                (H_DUE_MS, str(future.due_ms).encode()),
                (H_FIRED_MS, fired_ms),
            ]
            while True:
                try:
                    producer.produce(
                        future.callBackTopic, future.callBack, future.callBackKey, headers=headers
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
        # At least once: a timer leaves Redis only after Kafka acknowledged its callback.
        while producer.flush(1.0) > 0:
            pass
        client.zrem(KEY, *members)
        fired += len(members)
        if len(members) < CHUNK:
            return fired


def run_poller(port: int) -> int:
    stop = StopFlag()
    stop.install()
    common = CommonConfig.from_env()
    producer = Producer(producer_config(common.kafka))
    client = redis.Redis(host="127.0.0.1", port=port)
    # Orphaned (the harness was killed): take the private redis-server down too.
    exit_with_parent(lambda: client.shutdown(nosave=True))
    while not stop.requested:
        # On the second, as our oscillator ticks, so the designs differ only in what they do.
        next_s = math.floor(time.time() / POLL_INTERVAL_S + 1) * POLL_INTERVAL_S
        while not stop.requested and time.time() < next_s:
            time.sleep(min(0.05, max(0.0, next_s - time.time())))
        if not stop.requested:
            poll_once(client, producer, time.time_ns() // 1_000_000)
    producer.flush(10)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_baseline", description="the Redis poller")
    parser.add_argument("port", type=int, help="redis-server port on 127.0.0.1")
    args = parser.parse_args(argv)
    return run_poller(args.port)


if __name__ == "__main__":
    sys.exit(main())
