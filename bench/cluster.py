"""Where a run happens: one broker, and service instances (worker + oscillator) on it.

The broker is the embedded Tansu one on 127.0.0.1 unless ``KAFKA_BOOTSTRAP_SERVERS``
names a cluster. Every service instance gets its own topics and app id, so
measurements never see each other's records. Services run as child processes
(the way ``make run`` starts them) and are stopped by whoever started them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ktimers.broker import EmbeddedBroker, free_port, start_broker
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from tools.devstack import Child, advanced_ticks

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4
#: Worker start to first tick processed: ~5 s measured on the embedded broker (seconds).
READY_TIMEOUT_S = 120.0
#: Set on the worker to turn on precise mode (see the README).
PRECISE_ENV = {"TIMERS_PRECISE": "1"}


class BenchError(Exception):
    """A measurement could not be made; the message says why."""


@dataclass
class Broker:
    """The broker of this run and the environment that points clients at it."""

    env: dict[str, str]
    embedded: EmbeddedBroker | None

    @property
    def common(self) -> CommonConfig:
        return CommonConfig.from_env(self.env)

    @property
    def bootstrap(self) -> str:
        return self.env["KAFKA_BOOTSTRAP_SERVERS"]

    def describe(self, address: bool = True) -> str:
        """What the broker is; ``address=False`` leaves out the embedded one's port (random each run)."""
        if self.embedded is not None:
            where = f" on {self.bootstrap}" if address else ""
            return f"embedded Tansu{where} (memory storage)"
        return f"external cluster at {self.bootstrap} (profile {self.env['TIMERS_BROKER_PROFILE']})"

    def rss_bytes(self) -> int | None:
        """Resident memory of the embedded broker (None for an external one)."""
        if self.embedded is None:
            return None
        return tree_rss_bytes(self.embedded.process.pid)

    def child_env(self) -> dict[str, str]:
        """Our environment, minus anything that would change what is measured.

        Inherited ``TIMERS_*`` tuning is dropped (the service runs with its defaults),
        and so are ``KAFKA_*`` settings when the broker is the embedded one.
        """
        drop = ("TIMERS_", "KAFKA_") if self.embedded is not None else ("TIMERS_",)
        base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        return {**base, **self.env}

    def create_topic(self, base: str, partitions: int = PARTITIONS) -> str:
        """A new topic named ``<base>-<random>``; returns its name."""
        name = f"{base}-{uuid.uuid4().hex[:8]}"
        common = self.common
        admin = AdminClient({**common.kafka.librdkafka(), "log_level": 4})
        new = NewTopic(name, partitions, common.kafka.settings.replication_factor)
        for future in admin.create_topics([new], operation_timeout=30, request_timeout=30).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise BenchError(f"could not create topic {name!r}: {exc}") from exc
        return name


def instance_env(prefix: str, partitions: int) -> dict[str, str]:
    """Topic names and app id of a fresh service instance on a shared broker (``<prefix>-...-<random>``)."""
    suffix = uuid.uuid4().hex[:8]
    return {
        "TIMERS_TOPIC_OSCILLATOR": f"{prefix}-oscillator-{suffix}",
        "TIMERS_TOPIC_REQUEST": f"{prefix}-timer-request-{suffix}",
        "TIMERS_TOPIC_EVENTS": f"{prefix}-timer-events-{suffix}",
        "TIMERS_TOPIC_DLQ": f"{prefix}-timer-request-dlq-{suffix}",
        "TIMERS_PARTITIONS": str(partitions),
        "TIMERS_APP_ID": f"{prefix}-{suffix}",
    }


@contextlib.contextmanager
def open_broker(log_dir: Path) -> Iterator[Broker]:
    """The run's broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else an embedded one (stopped at exit)."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        env = {k: v for k, v in os.environ.items() if k.startswith("KAFKA_")}
        env["TIMERS_BROKER_PROFILE"] = os.environ.get("TIMERS_BROKER_PROFILE", "cluster")
        yield Broker(env=env, embedded=None)
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    embedded = start_broker(log_path=str(log_dir / "tansu.log"))
    try:
        yield Broker(env=embedded.env(), embedded=embedded)
    finally:
        embedded.stop()


def exit_with_parent(before_exit: Callable[[], None] | None = None) -> None:
    """End this helper process when the harness that started it is gone (killed, say):
    nothing of a run may outlive it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        if before_exit is not None:
            with contextlib.suppress(Exception):
                before_exit()
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants (bytes); 0 if it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.memory_info().rss
    return total


def disk_bytes(path: Path) -> int:
    """Space the files under ``path`` take on disk (allocated blocks, like ``du``)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def parse_metrics(body: str) -> dict[str, float]:
    """Prometheus text → {``name{labels}``: value}."""
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@dataclass
class ServiceStack:
    """One kafka-timers instance: its own topics and app id, one worker, one oscillator."""

    broker: Broker
    work_dir: Path
    name: str
    worker_env: Mapping[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    worker: Child | None = None
    oscillator: Child | None = None
    web_port: int = 0

    @property
    def common(self) -> CommonConfig:
        return CommonConfig.from_env(self.env)

    @property
    def data_dir(self) -> Path:
        return self.work_dir / f"{self.name}-data"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}/metrics"

    def start(self) -> ServiceStack:
        """Create the topics, start the oscillator and the worker, wait until a tick was processed."""
        self.env = {**self.broker.child_env(), **instance_env(f"bench-{self.name}", PARTITIONS)}
        create_topics(self.common)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.web_port = free_port()
        osc_env = {**self.env, "TIMERS_OSC_HEALTH_PORT": str(free_port())}
        self.oscillator = Child.start(
            "oscillator",
            ["-m", "oscillator.main"],
            osc_env,
            self.work_dir / f"{self.name}-oscillator.log",
            REPO,
        )
        worker_env = {
            **self.env,
            **self.worker_env,
            "TIMERS_DATA_DIR": str(self.data_dir),
            "TIMERS_WEB_PORT": str(self.web_port),
        }
        self.worker = Child.start(
            "worker",
            ["-m", "futures.worker.main"],
            worker_env,
            self.work_dir / f"{self.name}-worker.log",
            REPO,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while advanced_ticks(self.metrics_url) <= 0:
            self.check()
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: the worker processed no tick within {READY_TIMEOUT_S:g}s")
            time.sleep(0.2)
        return self

    def check(self) -> None:
        """Raise if the worker or the oscillator died."""
        for child in (self.worker, self.oscillator):
            if child is not None and child.process.poll() is not None:
                tail = child.log.read_text(errors="replace")[-3000:]
                raise BenchError(f"{self.name}: {child.name} exited ({child.process.returncode}):\n{tail}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:  # noqa: S310 - our own http URL
            return parse_metrics(response.read().decode())

    def metric_sum(self, name: str) -> float:
        """Sum of a metric over its labels."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))

    def wait_metric(self, name: str, at_least: float, timeout_s: float) -> float:
        """Wait until ``metric_sum(name) >= at_least``; return the value (may be short on timeout)."""
        deadline = time.monotonic() + timeout_s
        value = self.metric_sum(name)
        while value < at_least and time.monotonic() < deadline:
            self.check()
            time.sleep(0.2)
            value = self.metric_sum(name)
        return value

    @property
    def worker_pid(self) -> int:
        if self.worker is None:
            raise BenchError(f"{self.name}: the worker is not running")
        return self.worker.process.pid

    def worker_rss_bytes(self) -> int:
        return tree_rss_bytes(self.worker_pid)

    def data_bytes(self) -> int:
        return disk_bytes(self.data_dir)

    def stop(self) -> None:
        for child in (self.worker, self.oscillator):
            if child is not None:
                child.stop()


@contextlib.contextmanager
def service_stack(
    broker: Broker, work_dir: Path, name: str, worker_env: Mapping[str, str] | None = None
) -> Iterator[ServiceStack]:
    stack = ServiceStack(broker, work_dir, name, worker_env=dict(worker_env or {}))
    try:
        yield stack.start()
    finally:
        stack.stop()
