"""The job commands on a real Spark cluster: the standalone master and a worker of the pyspark package.

``timers-compact`` and ``timers-replay`` run with ``--master spark://127.0.0.1:P``
and must give what they give on ``local[2]``: the same snapshot, the same callbacks.
The cluster runs in its own process groups and is stopped whatever happens.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from confluent_kafka import Producer

from futures.jobs.snapshot import Manifest
from ktimers.wire import H_FIRED_MS, KIND_CANCEL, KIND_HEADER, Cancel, Future, TimerEvent
from tests.integration.conftest import TopicReader, fresh_env

pytestmark = pytest.mark.integration

SPARK_HOME = Path(pyspark.__file__).parent
BIN = Path(sys.executable).parent
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
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=15)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:P``: a standalone master with one worker (1 core, 1 GiB)."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    env = _spark_env(tmp)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str], ready: str) -> None:
        log = tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(  # noqa: S603 - our own command line
                [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(proc)
        _wait_for_line(log, ready, proc, timeout_s=90)

    try:
        master = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"]
        start("master", ["org.apache.spark.deploy.master.Master", *master], "I have been elected leader")
        worker = [url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0"]
        start(
            "worker",
            ["org.apache.spark.deploy.worker.Worker", *worker],
            "Successfully registered with master",
        )
        yield url
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


def _run(command: str, args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(  # noqa: S603 - the project's own console script
        [str(BIN / command), *args, "--quiet"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{command} {args} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def _snapshot(path: Path) -> tuple[set[tuple[Any, ...]], dict[str, Any]]:
    table = pq.read_table(path / "timers")
    rows = {(r["timer_id"], r["partition"], r["offset"], r["due_ms"], r["future"]) for r in table.to_pylist()}
    [manifest_file] = list((path / "manifest").glob("part-*"))
    return rows, Manifest.from_json(manifest_file.read_text().strip()).counts


@pytest.mark.timeout(900)  # four Spark jobs, each starting its own driver
def test_compact_and_replay_on_a_standalone_cluster_match_local(
    cluster: str, broker_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**_spark_env(tmp_path), **fresh_env(broker_env, partitions=PARTITIONS)}
    t0_ms = time.time_ns() // 1_000_000 - 3_600_000
    fate = _write_log(env, t0_ms)

    results = {}
    for master in (cluster, "local[2]"):
        out = tmp_path / f"snapshot-{uuid.uuid4().hex[:6]}"
        _run("timers-compact", ["--master", master, "--out", str(out)], env)
        results[master] = _snapshot(out)
    timers, counts = results[cluster]
    assert {row[0] for row in timers} == fate["pending"]
    assert {row[0]: row[3] for row in timers}["t15"] == t0_ms + 15 + 1000  # the second version
    assert (counts["fired"], counts["cancelled"], counts["superseded"], counts["pending"]) == (10, 5, 5, 15)
    assert results["local[2]"] == (timers, counts)

    # Re-send the callbacks (to their topic) of everything due in the last two hours that fired or is pending.
    window = ["--due-from", str((t0_ms - 3_600_000) // 1000), "--due-to", "now"]
    reader = TopicReader(env["KAFKA_BOOTSTRAP_SERVERS"], CALLBACKS, PARTITIONS)
    sent = {}
    try:
        for n, master in enumerate((cluster, "local[2]"), start=1):
            _run("timers-replay", ["--master", master, "--from-log", "--to-topic", CALLBACKS, *window], env)
            before = len(reader.records)
            wanted = 25 * n
            reader.read_until(lambda got: len(got) >= wanted, timeout_s=60)  # noqa: B023 - used at once
            reader.poll(1.0)  # and nothing more
            # Every header but the time of sending (kt-fired-ms).
            sent[master] = sorted(
                (r.key or b"", r.value or b"", tuple(h for h in r.headers if h[0] != H_FIRED_MS))
                for r in reader.records[before:]
            )
    finally:
        reader.close()
    assert {key.decode() for key, _, _ in sent[cluster]} == fate["fired"] | fate["pending"]
    assert len(sent[cluster]) == 25
    assert sent["local[2]"] == sent[cluster]
