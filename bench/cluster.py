"""Where a run happens: one broker, and service instances (worker + oscillator) on it.

Both are :mod:`tools.stack`'s, as for ``make run`` and the integration tests: the broker is
the embedded Tansu one on 127.0.0.1 unless ``KAFKA_BOOTSTRAP_SERVERS`` names a cluster;
every service instance gets its own topics and app id, so measurements never see each
other's records; services run as child processes with their default settings (inherited
``TIMERS_*`` tuning is dropped) and are stopped by whoever started them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psutil
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tools import stack

REPO = stack.REPO
PARTITIONS = 4
#: Worker start to first tick processed: ~5 s measured on the embedded broker (seconds).
READY_TIMEOUT_S = 120.0
#: Set on the worker to turn on precise mode (see the README).
PRECISE_ENV = {"TIMERS_PRECISE": "1"}


class BenchError(Exception):
    """A measurement could not be made; the message says why."""


class Broker(stack.Broker):
    """The broker of a run (:class:`tools.stack.Broker`), with what the benchmarks read of it."""

    def rss_bytes(self) -> int | None:
        """Resident memory of the embedded broker (None for an external one)."""
        if self.embedded is None:
            return None
        return tree_rss_bytes(self.embedded.process.pid)

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


def run_dir(name: str) -> Path:
    """Where a bench keeps a run's logs and data unless told otherwise: ``run/<name>-<time>``."""
    return REPO / "run" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def instance_env(prefix: str, partitions: int) -> dict[str, str]:
    """Topic names and app id of a fresh service instance on a shared broker (``<prefix>-...-<random>``)."""
    return stack.instance_env(f"{prefix}-", partitions)


@contextlib.contextmanager
def open_broker(log_dir: Path) -> Iterator[Broker]:
    """The run's broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else an embedded one (stopped at exit,
    a SIGTERM's too)."""
    with _sigterm_exits(), stack.open_broker(log_dir / "tansu.log") as broker:
        yield Broker(broker.env, broker.embedded, broker.log)


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``) ends the run as an exception does, through every context
    manager it is in, so that the broker and the services it started stop with it. Python's
    default would end the process at once and leave them running."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; its run installs one
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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


class ServiceStack(stack.Stack):
    """One kafka-timers instance of a run (:class:`tools.stack.Stack`): its own topics and app id,
    one worker, one oscillator; with what the benchmarks read of them."""

    @property
    def worker_pid(self) -> int:
        if self.worker is None:
            raise BenchError("the worker is not running")
        return self.worker.pid

    def worker_rss_bytes(self) -> int:
        return tree_rss_bytes(self.worker_pid)

    def data_bytes(self) -> int:
        return disk_bytes(self.data_dir)

    def wait_metric(self, name: str, at_least: float, timeout_s: float) -> float:
        """Wait until ``metric_sum(name) >= at_least``; return the value (may be short on timeout)."""
        return self.poll_metric(name, lambda value: value >= at_least, timeout_s, check=True)


@contextlib.contextmanager
def service_stack(
    broker: Broker, work_dir: Path, name: str, worker_env: Mapping[str, str] | None = None
) -> Iterator[ServiceStack]:
    """Create the topics, start the oscillator and the worker, wait until a tick was processed;
    stop them at exit."""
    services: list[stack.Service] = []
    env = {**broker.child_env(keep_tuning=False), **instance_env(f"bench-{name}", PARTITIONS)}
    logs = work_dir / name  # this instance's logs and worker data
    logs.mkdir(parents=True, exist_ok=True)
    spawn = stack.spawner(logs, services, inherit_env=False, own_session=True)
    service = ServiceStack(env, spawn, logs / "data").create_topics()
    service.data_dir.mkdir(exist_ok=True)
    try:
        service.start_oscillator(wait=False)
        service.worker = spawn(
            "worker", ["-m", "futures.worker.main"], {**service.worker_env(), **(worker_env or {})}
        )
        try:
            service.wait_for_tick(READY_TIMEOUT_S)
        except (stack.ChildDied, TimeoutError) as exc:
            raise BenchError(f"{name}: {exc}") from exc
        yield service
    finally:
        service.stop()
