"""The job commands on a real Spark cluster: the standalone master and a worker of the pyspark package.

``timers-compact`` and ``timers-replay`` run with ``--master spark://127.0.0.1:P``
and must give what the same jobs give on ``local[2]`` (the test session's Spark):
the same snapshot, the same callbacks. The cluster runs in its own process groups
and is stopped whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from futures.jobs import compact, replay
from futures.jobs.config import JobConfig
from futures.jobs.snapshot import Manifest
from ktimers.wire import H_FIRED_MS, KIND_CANCEL, KIND_HEADER, Cancel, Future, TimerEvent
from tests.integration.conftest import TopicReader, fresh_env

pytestmark = pytest.mark.integration

SPARK_HOME = Path(pyspark.__file__).parent
PARTITIONS = 4
CALLBACKS = f"orders-{uuid.uuid4().hex[:8]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp / "logs"),
        "SPARK_WORKER_DIR": str(tmp / "work"),
        # The executors' Python: the venv's (the system Python lacks pyarrow and this project).
        "PYSPARK_PYTHON": sys.executable,
    }


def _wait_for_line(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise AssertionError(f"no {needle!r} in {log} after {timeout_s}s:\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the JVM and anything it started
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        proc.poll()  # reap the group's leader: a zombie still counts as a member of its group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=15)


@dataclass
class Cluster:
    """A standalone master and one worker (1 core, 1 GiB), starting in the background."""

    url: str
    _ready: Callable[[], None]

    def ready(self) -> str:
        """``spark://127.0.0.1:P`` once the worker has registered with the master."""
        self._ready()
        return self.url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Started, not waited for: its JVMs come up while the test prepares (``Cluster.ready``)."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    env = _spark_env(tmp)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> tuple[Path, subprocess.Popen[bytes]]:
        log = tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(  # noqa: S603 - our own command line
                [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(proc)
        return log, proc

    try:
        master = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"]
        master_log, master_proc = start("master", ["org.apache.spark.deploy.master.Master", *master])
        # The worker retries its registration until the master is up: both JVMs start at once.
        worker = [url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0"]
        worker_log, worker_proc = start("worker", ["org.apache.spark.deploy.worker.Worker", *worker])

        def ready() -> None:
            _wait_for_line(master_log, "I have been elected leader", master_proc, timeout_s=90)
            _wait_for_line(worker_log, "Successfully registered with master", worker_proc, timeout_s=90)

        yield Cluster(url, ready)
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _write_log(env: dict[str, str], t0_ms: int) -> dict[str, set[str]]:
    """Requests and events of 30 timers due before now; returns the expected fate of each id."""
    bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
    request, events = env["TIMERS_TOPIC_REQUEST"], env["TIMERS_TOPIC_EVENTS"]
    producer = Producer({"bootstrap.servers": bootstrap})
    offsets: dict[tuple[str, int], int] = {}

    def send(timer: str, value: bytes, headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
        partition = int(timer[1:]) % PARTITIONS

        def delivered(err: object, msg: object) -> None:
            assert err is None, err
            offsets[(timer, msg.offset())] = partition  # type: ignore[attr-defined]

        producer.produce(request, value, timer.encode(), partition=partition, headers=headers or [],
                         on_delivery=delivered)  # fmt: skip
        producer.flush(10)

    fate: dict[str, set[str]] = {"fired": set(), "cancelled": set(), "pending": set()}
    for n in range(30):
        timer = f"t{n}"
        future = Future(id=timer, due_ms=t0_ms + n, callBackTopic=CALLBACKS, callBackKey=timer, callBack=b"x")
        send(timer, future.SerializeToString())
        if n < 10:  # fired: the worker's FIRED event names the version by its offset
            offset = max(o for (t, o) in offsets if t == timer)
            event = TimerEvent(id=timer, kind=TimerEvent.Kind.FIRED, partition=offsets[(timer, offset)],
                               source_offset=offset, due_ms=t0_ms + n)  # fmt: skip
            producer.produce(events, event.SerializeToString(), timer.encode())
            fate["fired"].add(timer)
        elif n < 15:
            send(timer, Cancel(id=timer).SerializeToString(), [(KIND_HEADER, KIND_CANCEL)])
            fate["cancelled"].add(timer)
        else:
            if n < 20:  # rescheduled: the second version is the pending one
                future.due_ms += 1000
                future.callBack = b"v2"
                send(timer, future.SerializeToString())
            fate["pending"].add(timer)
    producer.flush(10)
    return fate


# Both jobs through their console entry points (arguments, environment, Spark session as
# ``timers-compact`` and ``timers-replay`` build them), in one driver process: one JVM start.
# The replay waits for its go file: the test reads the callbacks of one replay at a time.
_DRIVER = """
import json, pathlib, sys, time
from futures.jobs import compact, replay
compact_args, replay_args, go = json.loads(sys.argv[1])
if compact.main(compact_args):
    sys.exit(1)
while not pathlib.Path(go).exists():
    time.sleep(0.1)
sys.exit(replay.main(replay_args))
"""


@dataclass
class ClusterJobs:
    """``compact`` then ``replay`` on a cluster, in the background; the replay starts on :meth:`go`."""

    proc: subprocess.Popen[str]
    go_file: Path

    @classmethod
    def start(
        cls, master: str, compact_args: list[str], replay_args: list[str], env: dict[str, str], tmp: Path
    ) -> ClusterJobs:
        # 30 timers: a few shuffle partitions, not Spark's 200 (each a task for the worker's one core).
        spark_args = ["--master", master, "--shuffle-partitions", "2", "--quiet"]
        go_file = tmp / "go-replay"
        args = [[*compact_args, *spark_args], [*replay_args, *spark_args], str(go_file)]
        command = [sys.executable, "-c", _DRIVER, json.dumps(args)]
        proc = subprocess.Popen(  # noqa: S603 - the project's own jobs
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return cls(proc, go_file)

    def go(self) -> None:
        self.go_file.touch()

    def wait(self) -> None:
        output, _ = self.proc.communicate(timeout=600)
        assert self.proc.returncode == 0, f"the jobs on the cluster failed:\n{output[-6000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _snapshot(path: Path) -> tuple[set[tuple[Any, ...]], dict[str, Any]]:
    table = pq.read_table(path / "timers", columns=["timer_id", "partition", "offset", "due_ms", "future"])
    rows = {(r["timer_id"], r["partition"], r["offset"], r["due_ms"], r["future"]) for r in table.to_pylist()}
    [manifest_file] = list((path / "manifest").glob("part-*"))
    return rows, Manifest.from_json(manifest_file.read_text().strip()).counts


def _sent(reader: TopicReader, wanted: int) -> list[tuple[bytes, bytes, tuple[Any, ...]]]:
    """The callbacks that arrive until there are ``wanted`` in all (and a second more), without
    the time of sending (kt-fired-ms)."""
    before = len(reader.records)
    reader.read_until(lambda got: len(got) >= wanted, timeout_s=60)
    reader.poll(1.0)  # and nothing more
    return sorted(
        (r.key or b"", r.value or b"", tuple(h for h in r.headers if h[0] != H_FIRED_MS))
        for r in reader.records[before:]
    )


@pytest.mark.timeout(600)
def test_compact_and_replay_on_a_standalone_cluster_match_local(
    cluster: Cluster, spark: SparkSession, broker_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**_spark_env(tmp_path), **fresh_env(broker_env, partitions=PARTITIONS)}
    t0_ms = time.time_ns() // 1_000_000 - 3_600_000
    fate = _write_log(env, t0_ms)
    # Re-send the callbacks (to their topic) of everything due in the last two hours that fired or is pending.
    due_from_s = (t0_ms - 3_600_000) // 1000
    resend = ["--from-log", "--to-topic", CALLBACKS, "--due-from", str(due_from_s), "--due-to", "now"]
    cluster_out = tmp_path / "snapshot-cluster"
    jobs = ClusterJobs.start(cluster.ready(), ["--out", str(cluster_out)], resend, env, tmp_path)
    reader = TopicReader(env["KAFKA_BOOTSTRAP_SERVERS"], CALLBACKS, PARTITIONS)
    try:
        # local[2]: the test session's own Spark, in this process, while the cluster compacts.
        config = JobConfig.from_env(env)
        local_out = tmp_path / "snapshot-local"
        compact.run(spark, config, compact.CompactOptions(out=str(local_out)))
        now_ms = time.time_ns() // 1_000_000
        window = replay.ReplayOptions(due_from_ms=due_from_s * 1000, due_to_ms=now_ms, to_topic=CALLBACKS)
        replay.run(spark, config, window)
        sent_local = _sent(reader, 25)
        jobs.go()
        jobs.wait()
        sent_cluster = _sent(reader, 50)
    finally:
        jobs.kill()
        reader.close()

    timers, counts = _snapshot(cluster_out)
    assert {row[0] for row in timers} == fate["pending"]
    assert {row[0]: row[3] for row in timers}["t15"] == t0_ms + 15 + 1000  # the second version
    assert (counts["fired"], counts["cancelled"], counts["superseded"], counts["pending"]) == (10, 5, 5, 15)
    assert _snapshot(local_out) == (timers, counts)

    assert {key.decode() for key, _, _ in sent_cluster} == fate["fired"] | fate["pending"]
    assert len(sent_cluster) == 25
    assert sent_local == sent_cluster
