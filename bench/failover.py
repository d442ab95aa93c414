"""``make failover``: how long a SIGKILLed worker's partitions stop firing.

Two measurements, on the embedded broker (or ``KAFKA_BOOTSTRAP_SERVERS``), with one
oscillator and timers due every 100 ms in every partition:

* **takeover**: two workers share the partitions; one is SIGKILLed. Measured from
  the kill to the first callback the survivor fires for each partition the dead
  one held (by ``kt-fired-ms``, the worker's clock at dispatch: same host).
* **restart**: one worker holds every partition; it is SIGKILLed and started again
  at once on the same data dir (as a pod's container is). Measured from the kill to
  the first callback fired again in each partition, process start included.

A partition is back when it fires again; the table gives the worst partition of
each round (median and max over the rounds), and the best. Group timeouts are
the worker's (its profile's unless ``TIMERS_SESSION_TIMEOUT_S`` and friends are
set here: they are passed on), so the figures say which were measured. A second
table says where the time went: when the worker that takes over logged each step
(:data:`STEPS`), in milliseconds after the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from bench.cluster import REPO, BenchError, Broker, instance_env, open_broker, run_dir
from bench.render import render
from bench.results import FailoverKind, FailoverRun, FailoverStep, store
from futures.client import TimerClient, TimerSpec
from futures.client.partitioner import crc32_partition
from futures.worker.config import WorkerConfig
from ktimers.broker import free_port
from ktimers.config import BrokerProfile, CommonConfig, ProfileSettings
from ktimers.topics import create_topics
from ktimers.wire import H_FIRED_MS, H_ID, header_value
from tools.devstack import record_headers
from tools.stack import ChildDied, Service, SpawnFn, spawner

PARTITIONS = 4
EVERY_S = 0.1  # one timer due this often in every partition (seconds)
READY_TIMEOUT_S = 90.0
BACK_TIMEOUT_S = 90.0  # longest a partition may stay silent before the round fails (seconds)
#: Variables passed on to the workers: the group settings being measured.
GROUP_ENV = ("TIMERS_SESSION_TIMEOUT_S", "TIMERS_HEARTBEAT_S", "TIMERS_REBALANCE_TIMEOUT_S")

#: The steps of a round, in order, as the log of the worker that takes over shows
#: them (Faust's and aiokafka's own lines): (step, what the line contains).
STEPS: dict[str, tuple[tuple[str, str], ...]] = {
    "takeover": (
        (
            "the dead member dropped (the survivor told at its heartbeat)",
            r"Heartbeat failed for group .* rebalancing",
        ),
        ("JoinGroup answered", r"Joined group"),
        ("its tables recovered", r"Worker ready"),
    ),
    "restart": (
        ("the new process logging (interpreter, imports, app build)", r"\[\^Worker\]: Starting"),
        ("JoinGroup sent", r"\(Re-\)joining group"),
        ("JoinGroup answered", r"Joined group"),
        ("its tables recovered", r"Worker ready"),
    ),
}
LAST_STEP = "first callback fired in every partition"
#: How Faust's log lines start: ``[2026-11-24 03:14:50,762]`` (local time).
_LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def clock(epoch_ms: int) -> str:
    """``epoch_ms`` as the workers' logs show time (UTC, milliseconds): to line a round up with them."""
    return time.strftime("%H:%M:%S", time.gmtime(epoch_ms / 1000)) + f".{epoch_ms % 1000:03d}"


def log_steps(log: Path, kind: str, since_ms: int) -> dict[str, int]:
    """Milliseconds from ``since_ms`` (epoch) to the first line of each step in a worker's log."""
    found: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        stamp = _LOG_TIME.match(line)
        if stamp is None:
            continue
        at_ms = round(datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)
        if at_ms < since_ms:
            continue
        for step, pattern in STEPS[kind]:
            if step not in found and re.search(pattern, line):
                found[step] = at_ms - since_ms
    return found


def readiness(port: int) -> tuple[str, list[int]]:
    """A worker's ``/readyz``: (status, partitions it holds)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:  # noqa: S310
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
    except OSError:
        return "unreachable", []
    return str(body.get("status")), [int(p) for p in body.get("partitions", [])]


@dataclass
class Worker:
    name: str
    data_dir: Path
    port: int
    instance_id: str
    service: Service | None = None

    def held(self) -> list[int]:
        status, partitions = readiness(self.port)
        return partitions if status == "ready" else []


@dataclass
class Instance:
    """One service instance: topics, a callback topic, an oscillator and its workers."""

    broker: Broker
    work: Path
    env: dict[str, str] = field(default_factory=dict)
    callback_topic: str = ""
    workers: list[Worker] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    #: Workers run with static membership (``TIMERS_INSTANCE_ID``).
    static: bool = True

    def start(self, worker_env: Mapping[str, str]) -> None:
        self.env = {
            **self.broker.child_env(keep_tuning=False),
            **worker_env,
            **instance_env("failover", PARTITIONS),
        }
        create_topics(CommonConfig.from_env(self.env))
        self.callback_topic = self.broker.create_topic("failover-callbacks")
        self.spawn(
            "oscillator", ["-m", "oscillator.main"], {**self.env, "TIMERS_OSC_HEALTH_PORT": str(free_port())}
        )
        for name in ("a", "b"):
            self.workers.append(Worker(name, self.work / f"data-{name}", free_port(), f"worker-{name}"))

    @property
    def spawn(self) -> SpawnFn:
        return spawner(self.work, self.services, inherit_env=False, own_session=True)

    def start_worker(self, worker: Worker) -> None:
        """Start the worker, or start it again on its data dir (its log goes on in the same file)."""
        if worker.service is None:
            env = {
                **self.env,
                "TIMERS_DATA_DIR": str(worker.data_dir),
                "TIMERS_WEB_PORT": str(worker.port),
            }
            if self.static:
                env["TIMERS_INSTANCE_ID"] = worker.instance_id
            worker.service = self.spawn(
                f"worker-{worker.name}", ["-m", "futures.worker.main"], env, start=False
            )
        worker.service.start()

    def wait_split(self, workers: list[Worker], timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until ``workers`` are ready and hold every partition once between them."""
        deadline = time.monotonic() + timeout_s
        while True:
            held = [w.held() for w in workers]
            if sorted(sum(held, [])) == list(range(PARTITIONS)) and all(held):
                return
            for w in workers:
                if w.service is not None:
                    w.service.check()
            if time.monotonic() > deadline:
                raise BenchError(f"partitions never split between {[w.name for w in workers]}: {held}")
            time.sleep(0.1)

    def kill(self, worker: Worker) -> int:
        """SIGKILL ``worker``; the kill time (epoch ms)."""
        assert worker.service is not None and worker.service.process is not None  # noqa: S101 - started
        worker.service.process.kill()
        killed = now_ms()
        worker.service.process.wait()
        return killed

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop(timeout_s=10)


@contextmanager
def instance(
    broker: Broker, work: Path, worker_env: Mapping[str, str], static: bool = True
) -> Iterator[Instance]:
    inst = Instance(broker, work, static=static)
    try:
        inst.start(worker_env)
        yield inst
    finally:
        inst.stop()


class Timers:
    """Schedules timers due every ``EVERY_S`` in every request partition; reads their callbacks."""

    def __init__(self, inst: Instance) -> None:
        self._inst = inst
        self._client = TimerClient(CommonConfig.from_env(inst.env))
        self.partition_of: dict[str, int] = {}
        self._ids: dict[int, Iterator[str]] = {p: self._ids_for(p) for p in range(PARTITIONS)}
        self._consumer = Consumer(
            {
                "bootstrap.servers": inst.broker.bootstrap,
                "group.id": f"failover-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 20,
            }
        )
        self._consumer.assign([TopicPartition(inst.callback_topic, p, OFFSET_END) for p in range(PARTITIONS)])

    @staticmethod
    def _ids_for(partition: int) -> Iterator[str]:
        while True:
            candidate = uuid.uuid4().hex
            if crc32_partition(candidate.encode(), PARTITIONS) == partition:
                yield candidate

    def schedule(self, span_s: float, lead_s: float = 1.0) -> None:
        """Timers due from ``lead_s`` to ``lead_s + span_s`` from now, ``EVERY_S`` apart, per partition."""
        start = time.time() + lead_s
        specs = []
        for i in range(int(span_s / EVERY_S)):
            for p in range(PARTITIONS):
                timer_id = next(self._ids[p])
                self.partition_of[timer_id] = p
                specs.append(
                    TimerSpec(self._inst.callback_topic, timer_id, b"x", at=start + i * EVERY_S, id=timer_id)
                )
        self._client.schedule_many(specs)
        self._client.flush(30)

    def first_fired_after(
        self, since_ms: int, partitions: set[int], timeout_s: float, check: list[Worker]
    ) -> dict[int, int]:
        """Epoch ms of the first callback fired after ``since_ms`` in each of ``partitions``."""
        first: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while set(first) != partitions:
            if time.monotonic() > deadline:
                silent = sorted(partitions - set(first))
                raise BenchError(f"partitions {silent} did not fire within {timeout_s}s")
            for w in check:
                if w.service is not None:
                    w.service.check()
            for msg in self._consumer.consume(10_000, timeout=0.05):
                if msg.error() is not None:
                    continue
                headers = record_headers(msg)
                timer_id = (header_value(headers, H_ID) or b"").decode()
                fired = int(header_value(headers, H_FIRED_MS) or 0)
                partition = self.partition_of.get(timer_id)
                if partition in partitions and fired > since_ms and partition not in first:
                    first[partition] = fired
        return first

    def close(self) -> None:
        self._consumer.close()
        self._client.close(10)


@dataclass
class Round:
    kind: str
    partitions: list[int]
    back_ms: dict[int, int]
    #: ms after the kill of each step (:data:`STEPS`) the worker taking over logged.
    steps: dict[str, int] = field(default_factory=dict)

    def progress(self, n: int, killed_ms: int, who: str = "") -> str:
        steps = ", ".join(f"{ms / 1000:.2f}" for ms in self.steps.values())
        return f"  {self.kind} {n}: {self.worst_s:.2f}s ({who}killed at {clock(killed_ms)}; steps {steps})"

    @property
    def worst_s(self) -> float:
        return max(self.back_ms.values()) / 1000

    @property
    def best_s(self) -> float:
        return min(self.back_ms.values()) / 1000


def takeover_rounds(inst: Instance, timers: Timers, rounds: int) -> list[Round]:
    a, b = inst.workers
    results = []
    for n in range(rounds):
        victim, survivor = (b, a) if n % 2 == 0 else (a, b)
        inst.wait_split([a, b])
        timers.schedule(span_s=40)
        time.sleep(3.0)  # steady firing first
        held = set(victim.held())
        killed = inst.kill(victim)
        first = timers.first_fired_after(killed, held, BACK_TIMEOUT_S, [survivor])
        assert survivor.service is not None  # noqa: S101 - started before
        steps = log_steps(survivor.service.log, "takeover", killed)
        results.append(Round("takeover", sorted(held), {p: t - killed for p, t in first.items()}, steps))
        print(results[-1].progress(n + 1, killed, f"{victim.name} "), flush=True)
        inst.start_worker(victim)
    return results


def restart_rounds(inst: Instance, timers: Timers, rounds: int) -> list[Round]:
    a, b = inst.workers
    assert b.service is not None  # noqa: S101 - started by the takeover rounds
    b.service.stop()
    inst.wait_split([a])
    results = []
    for n in range(rounds):
        inst.wait_split([a])
        timers.schedule(span_s=40)
        time.sleep(3.0)
        killed = inst.kill(a)
        inst.start_worker(a)
        everything = set(range(PARTITIONS))
        first = timers.first_fired_after(killed, everything, BACK_TIMEOUT_S, [a])
        assert a.service is not None  # noqa: S101 - started above
        steps = log_steps(a.service.log, "restart", killed)
        results.append(Round("restart", sorted(everything), {p: t - killed for p, t in first.items()}, steps))
        print(results[-1].progress(n + 1, killed), flush=True)
    return results


def group_settings(env: Mapping[str, str]) -> str:
    session, heartbeat, rebalance = WorkerConfig.from_env(env).group_timeouts
    return f"session {session:g} s, heartbeat {heartbeat:g} s, rebalance {rebalance:g} s"


def kinds(rounds: list[Round]) -> list[FailoverKind]:
    """Per kind of round: how long its partitions stayed silent, median and worst over the rounds."""
    found = []
    for kind in STEPS:
        mine = [r for r in rounds if r.kind == kind]
        if mine:
            worst = [r.worst_s for r in mine]
            best = [r.best_s for r in mine]
            found.append(
                FailoverKind(kind, len(mine), statistics.median(worst), max(worst), statistics.median(best))
            )
    return found


def steps(rounds: list[Round]) -> list[FailoverStep]:
    """Seconds after the kill at which each step was logged: median and range over the rounds, per kind."""
    found = []
    for kind, patterns in STEPS.items():
        mine = [r for r in rounds if r.kind == kind]
        if not mine:
            continue
        for step in [*(name for name, _ in patterns), LAST_STEP]:
            values = [r.worst_s * 1000 if step == LAST_STEP else r.steps.get(step) for r in mine]
            known = [v / 1000 for v in values if v is not None]
            if len(known) < len(mine):  # a line not found in some round's log: no median to show
                found.append(FailoverStep(kind, step, None))
            else:
                found.append(FailoverStep(kind, step, statistics.median(known), min(known), max(known)))
    return found


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="kills of each kind (default: 3)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs", help="docs directory to update (default: docs)"
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="logs and worker data (default: run/failover-<time>)"
    )
    parser.add_argument(
        "--dynamic", action="store_true", help="workers without TIMERS_INSTANCE_ID (dynamic membership)"
    )
    args = parser.parse_args(argv)
    work = args.work or run_dir("failover")
    work.mkdir(parents=True, exist_ok=True)
    # The cluster profile's group timeouts, unless set here: on the embedded broker too.
    cluster = ProfileSettings.for_profile(BrokerProfile.CLUSTER)
    defaults = (cluster.session_timeout_s, cluster.heartbeat_s, cluster.rebalance_timeout_s)
    worker_env = {k: os.environ.get(k) or f"{v:g}" for k, v in zip(GROUP_ENV, defaults, strict=True)}
    # What was measured; --out and --work only say where results go.
    command = f"python -m bench.failover --rounds {args.rounds}" + (" --dynamic" if args.dynamic else "")
    load_before = load()
    with ExitStack() as stack:
        broker = stack.enter_context(open_broker(work))
        settings = group_settings({**broker.env, **worker_env})
        static = not args.dynamic and broker.common.kafka.settings.static_membership
        membership = "static" if static else "dynamic"
        settings += f", {membership} membership"
        print(f"failover on {broker.describe()}; {settings}; load {load()}", flush=True)
        inst = stack.enter_context(instance(broker, work, worker_env, static=not args.dynamic))
        for worker in inst.workers:
            inst.start_worker(worker)
        timers = Timers(inst)
        stack.callback(timers.close)
        try:
            rounds = takeover_rounds(inst, timers, args.rounds)
            rounds += restart_rounds(inst, timers, args.rounds)
        except (BenchError, ChildDied, subprocess.SubprocessError) as exc:
            print(f"failover: {exc}; logs in {work}", file=sys.stderr)
            return 1
    run = FailoverRun(
        command=command,
        when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        broker=broker.describe(address=False),
        partitions=PARTITIONS,
        every_ms=EVERY_S * 1000,
        settings=settings,
        load_before=load_before,
        load_after=load(),
        cores=os.cpu_count() or 0,
        kinds=kinds(rounds),
        steps=steps(rounds),
    )
    store(args.out, "failover", run)
    print(f"written: {', '.join(map(str, render(args.out)))}; logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
