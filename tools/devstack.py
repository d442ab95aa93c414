"""``make run``: the whole system on the embedded broker, with a demo that shows it working.

Starts, in order: the embedded Tansu broker, the service's topics, one oscillator,
one futures worker, then a demo producer that schedules a few timers every couple
of seconds (one of each batch is cancelled at once and must never arrive) and a
printer that shows each callback as it arrives, with its lateness.

Stops on Ctrl-C, SIGTERM, or after ``RUN_SECONDS`` seconds (counted from start)
and exits 0. If the worker, the oscillator or the broker dies on its own, prints
the tail of its log and exits 1.

The broker keeps everything in memory: every run is a brand new cluster, and a worker
whose data directory remembers an older one fails its table recovery, so the worker
gets a fresh data directory every run.
Everything a run writes is under ``run/`` (the logs and ``data-<timestamp>/``);
``make clean`` removes it.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from futures.client import TimerClient, TimerHandle
from ktimers.config import CommonConfig
from ktimers.errors import TimersError
from ktimers.shutdown import StopFlag
from ktimers.topics import admin_client, create_topics
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, H_TOKEN, header_value, text_or_repr
from tools.stack import REPO, Broker, ChildDied, Service, Stack, open_broker, spawner, tail

RUN_DIR = REPO / "run"
BROKER_LOG = RUN_DIR / "tansu.log"

DEMO_TOPIC = "demo-callbacks"
DEMO_EVERY_S = 2.0  # a new batch of demo timers this often (seconds)
DEMO_TIMERS_PER_BATCH = 3
READY_TIMEOUT_S = 90.0  # worker start to first tick processed; ~5 s measured (seconds)
POLL_S = 0.2  # longest the main loop blocks, so a stop request is seen quickly (seconds)
# A timer due this long before the stop must have arrived: ticks come every
# second, plus a margin for the trip through Kafka (milliseconds).
SETTLE_MS = 2000

EXIT_OK = 0
EXIT_CHILD_DIED = 1


def now_ms() -> int:
    return round(time.time() * 1000)


def clock(epoch_ms: int | None = None) -> str:
    """Local wall-clock time with milliseconds, for the demo output."""
    ms = now_ms() if epoch_ms is None else epoch_ms
    return time.strftime("%H:%M:%S", time.localtime(ms // 1000)) + f".{ms % 1000:03d}"


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Demo:
    """Schedules demo timers and checks the callbacks that come back."""

    client: TimerClient
    rng: random.Random = field(default_factory=random.Random)
    batch: int = 0
    expected: dict[str, TimerHandle] = field(default_factory=dict)
    cancelled: dict[str, TimerHandle] = field(default_factory=dict)
    arrived: dict[str, int] = field(default_factory=dict)  # timer id -> lateness ms
    cancelled_arrived: list[str] = field(default_factory=list)

    def schedule_batch(self) -> None:
        """A few timers due in 1-10 s (some with a token), and one cancelled right away."""
        self.batch += 1
        for i in range(DEMO_TIMERS_PER_BATCH):
            delay_s = round(self.rng.uniform(1.0, 10.0), 1)
            token = f"tok-{uuid.uuid4().hex[:8]}" if i == 0 else None
            key = f"order-{self.batch}-{i}"
            handle = self.client.schedule(
                DEMO_TOPIC, key, f"reminder {self.batch}.{i}", delay=delay_s, token=token
            )
            self.expected[handle.id] = handle
            with_token = f" token={token}" if token else ""
            say(f"{clock()}  scheduled  id={handle.id} key={key} in {delay_s:.1f}s{with_token}")
        doomed = self.client.schedule(
            DEMO_TOPIC, f"order-{self.batch}-x", f"cancelled {self.batch}", delay=self.rng.uniform(2.0, 5.0)
        )
        self.client.cancel(doomed)
        self.cancelled[doomed.id] = doomed
        say(f"{clock()}  cancelled  id={doomed.id} key=order-{self.batch}-x (must never arrive)")
        # Surfaces a delivery error now rather than at the next batch.
        self.client.flush(timeout=10.0)

    def on_callback(self, msg: Message, received_ms: int) -> None:
        headers = record_headers(msg)
        timer_id = text_or_repr(header_value(headers, H_ID))
        due_raw = header_value(headers, H_DUE_MS)
        lateness_ms = received_ms - int(due_raw) if due_raw and due_raw.isdigit() else None
        token = header_value(headers, H_TOKEN)
        late = "?" if lateness_ms is None else f"{lateness_ms:+d} ms"
        fired_raw = header_value(headers, H_FIRED_MS)
        if lateness_ms is not None and due_raw and fired_raw and fired_raw.isdigit():
            # How much of the lateness is the worker's (fired) and how much the trip to us.
            late += f" (fired {int(fired_raw) - int(due_raw):+d})"
        with_token = f" token={text_or_repr(token)}" if token else ""
        say(
            f"{clock(received_ms)}  CALLBACK   id={timer_id} key={text_or_repr(msg.key())} "
            f"payload={text_or_repr(msg.value())!r} lateness={late}{with_token}"
        )
        if timer_id in self.cancelled:
            self.cancelled_arrived.append(timer_id)
            say(f"{clock()}  ERROR: cancelled timer {timer_id} fired")
        elif timer_id is not None and lateness_ms is not None:
            self.arrived[timer_id] = lateness_ms

    def summary(self, stopped_ms: int) -> str:
        """What arrived; timers due over :data:`SETTLE_MS` before ``stopped_ms`` must have."""
        settled = [h.id for h in self.expected.values() if h.due_ms <= stopped_ms - SETTLE_MS]
        missing = [i for i in settled if i not in self.arrived]
        cancelled_settled = sum(1 for h in self.cancelled.values() if h.due_ms <= stopped_ms - SETTLE_MS)
        late = sorted(self.arrived.values())
        settle = f"{SETTLE_MS / 1000:g}s"
        lateness = f" (lateness {late[0]:+d}..{late[-1]:+d} ms)" if late else ""
        lines = [
            f"demo: {len(self.expected)} timers scheduled, {len(self.arrived)} arrived{lateness}; "
            f"{len(settled) - len(missing)} of the {len(settled)} due over {settle} ago arrived",
            f"demo: {len(self.cancelled)} cancelled ({cancelled_settled} due over {settle} ago), "
            f"{len(self.cancelled_arrived)} of them arrived",
        ]
        if missing:
            lines.append(f"demo: MISSING callbacks: {', '.join(missing)}")
        return "\n".join(lines)


def record_headers(msg: Message) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]


def create_demo_topic(common: CommonConfig) -> list[int]:
    """Create the demo callback topic (the worker never creates one); return its partition numbers."""
    create_topics(common, callback_topics=[DEMO_TOPIC])
    return sorted(admin_client(common).list_topics(timeout=10).topics[DEMO_TOPIC].partitions)


def callback_consumer(common: CommonConfig, partitions: list[int]) -> Consumer:
    consumer = Consumer(
        {
            **common.kafka.librdkafka(),
            # assign() needs no group (joining one takes seconds on this broker),
            # but librdkafka still wants an id. Nothing is committed.
            "group.id": f"devstack-printer-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            # Bounds how long a fetch waits, so the printed lateness is the
            # service's, not the printer's.
            "fetch.wait.max.ms": 50,
        }
    )
    consumer.assign([TopicPartition(DEMO_TOPIC, p, OFFSET_BEGINNING) for p in partitions])
    return consumer


class DevStack:
    """The broker, the oscillator and the worker (:mod:`tools.stack`), and the demo on them."""

    def __init__(self, stop: StopFlag, run_seconds: float | None) -> None:
        self.stop = stop
        self.deadline = None if run_seconds is None else time.monotonic() + run_seconds
        self.exits = contextlib.ExitStack()
        self.broker: Broker | None = None
        self.services: list[Service] = []
        self.stack: Stack | None = None
        self.client: TimerClient | None = None
        self.consumer: Consumer | None = None
        self.demo: Demo | None = None

    def should_stop(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.stop.request("RUN_SECONDS elapsed")
        return self.stop.requested

    def check_services(self) -> None:
        for service in self.services:
            service.check()
        if self.broker is not None:
            self.broker.check()

    def run(self) -> None:
        RUN_DIR.mkdir(exist_ok=True)
        # Each run is a new cluster: its logs start afresh too.
        for log in (BROKER_LOG, *RUN_DIR.glob("*.log")):
            log.unlink(missing_ok=True)
        self.broker = self.exits.enter_context(open_broker(BROKER_LOG, external=False))
        env = self.broker.child_env(keep_tuning=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        data_dir = RUN_DIR / f"data-{stamp}-{now_ms() % 1000:03d}"
        data_dir.mkdir()
        spawn = spawner(RUN_DIR, self.services, inherit_env=False, own_session=True, numbered=False)
        self.stack = stack = Stack(env, spawn, data_dir).create_topics()
        oscillator = stack.start_oscillator(wait=False)
        worker = stack.start_worker(wait=False)
        common = stack.common
        health = f"http://127.0.0.1:{oscillator.env['TIMERS_OSC_HEALTH_PORT']}/healthz"
        self.banner(common, stack.metrics_url, health, data_dir, [BROKER_LOG, oscillator.log, worker.log])

        partitions = create_demo_topic(common)
        self.consumer = callback_consumer(common, partitions)
        self.client = TimerClient(common)
        self.demo = Demo(self.client)

        say(f"{clock()}  waiting for the worker to join and process a tick (a few seconds)...")
        try:
            if not stack.wait_for_tick(READY_TIMEOUT_S, stop=self.should_stop):
                return
        except TimeoutError as exc:
            raise ChildDied("worker", f"{exc}; last lines:\n{tail(worker.log)}") from exc
        say(f"{clock()}  worker is processing ticks; demo timers every {DEMO_EVERY_S:g}s to {DEMO_TOPIC!r}")
        next_batch = time.monotonic()
        while not self.should_stop():
            self.check_services()
            if time.monotonic() >= next_batch:
                self.demo.schedule_batch()
                next_batch += DEMO_EVERY_S
            self.print_callbacks(POLL_S)

    def print_callbacks(self, timeout_s: float) -> None:
        assert self.consumer is not None and self.demo is not None  # noqa: S101 - set in run()
        msg = self.consumer.poll(timeout_s)
        if msg is None:
            return
        received_ms = now_ms()
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                say(f"{clock()}  printer: {err.str()}")
            return
        self.demo.on_callback(msg, received_ms)

    def banner(
        self, common: CommonConfig, metrics_url: str, health_url: str, data_dir: Path, logs: list[Path]
    ) -> None:
        bootstrap = common.kafka.bootstrap_servers
        rel = os.path.relpath
        listed = ", ".join(rel(log) for log in logs)
        say(
            "\n".join(
                [
                    "kafka-timers dev stack (embedded Tansu broker: memory only, every run starts empty)",
                    f"  bootstrap   {bootstrap}",
                    f"  worker      {metrics_url}",
                    f"  oscillator  {health_url}",
                    f"  data        {rel(data_dir)}",
                    f"  logs        {listed}",
                    f"  try         KAFKA_BOOTSTRAP_SERVERS={bootstrap} TIMERS_BROKER_PROFILE=embedded "
                    f".venv/bin/timers schedule --topic {DEMO_TOPIC} --key hello --value hi --delay 3s",
                    "  stop        Ctrl-C" + ("" if self.deadline is None else " (or wait for RUN_SECONDS)"),
                ]
            )
        )

    def shutdown(self) -> None:
        """Producer and printer first, then the services, then the broker they talk to."""
        if self.client is not None:
            try:
                self.client.close(timeout=5.0)
            except TimersError as exc:
                say(f"demo producer: {exc}")
        if self.demo is not None:
            say(self.demo.summary(now_ms()))
        if self.consumer is not None:
            self.consumer.close()
        # Drop the last references so librdkafka closes the producer's connections:
        # the broker waits for open connections before it exits on SIGTERM.
        self.client = self.demo = self.consumer = None
        if self.stack is not None:
            self.stack.stop()  # worker, then oscillator
        self.exits.close()  # the broker they talked to


def run_seconds_from_env() -> float | None:
    raw = os.environ.get("RUN_SECONDS", "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise SystemExit(f"devstack: RUN_SECONDS={raw!r}: expected a positive number of seconds")
    return seconds


def main() -> int:
    stop = StopFlag()
    stop.install()
    stack = DevStack(stop, run_seconds_from_env())
    code = EXIT_OK
    try:
        stack.run()
    except ChildDied as exc:
        print(f"devstack: {exc}", file=sys.stderr, flush=True)
        stop.request(f"{exc.who} failed")
        code = EXIT_CHILD_DIED
    finally:
        say(f"{clock()}  stopping ({stop.reason or 'error'})")
        stack.shutdown()
    say(f"{clock()}  stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
