"""Run the service on this machine: a broker, an oscillator and workers as child processes.

One helper serves everything that does: ``make run`` (tools/devstack.py), the benchmarks
(bench/) and the integration tests (tests/integration/conftest.py).

* :func:`open_broker`: the embedded Tansu broker on 127.0.0.1, or the cluster named by
  ``KAFKA_BOOTSTRAP_SERVERS``, as a :class:`Broker` whose ``env`` points clients at it.
* :func:`instance_env`: the topic names and app id of a fresh service instance, so that
  instances sharing a broker never see each other's records.
* :class:`Stack`: one service instance — its worker and oscillators as :class:`Service`
  processes, its metrics (:func:`parse_metrics`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from prometheus_client.parser import text_string_to_metric_families

from ktimers.broker import EmbeddedBroker, free_port, start_broker
from ktimers.config import CommonConfig
from ktimers.topics import create_topics

REPO = Path(__file__).resolve().parent.parent
#: What the worker and the oscillator print once they serve.
WORKER_READY = "timer table ready"
OSCILLATOR_READY = "oscillator started"
#: SIGTERM to SIGKILL when stopping a service (seconds).
STOP_TIMEOUT_S = 20.0
#: The worker's counter of ticks that moved its clock: above 0 once it fires timers.
ADVANCED_TICKS = 'timers_ticks_total{outcome="advanced"}'


class ChildDied(Exception):
    """A service process exited while it should have been running; the message has its log's tail."""

    def __init__(self, who: str, detail: str) -> None:
        super().__init__(f"{who} {detail}")
        self.who = who


def exit_status(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Service:
    """One service process, restartable; its output goes to ``log``, each start marked in it."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    #: Run with this process's environment under ``env`` (else with ``env`` alone).
    inherit_env: bool = True
    #: In a session of its own: Ctrl-C in the terminal then reaches only the parent, which stops
    #: its services in order (a worker before the broker it talks to).
    own_session: bool = False
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> Service:
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n===== start #{self.starts} =====\n".encode())
            out.flush()
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and modules
                self.argv,
                env={**os.environ, **self.env} if self.inherit_env else dict(self.env),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=self.own_session,
            )
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ChildDied(self.name, "was never started")
        return self.process.pid

    def check(self) -> None:
        """Raise :class:`ChildDied` if it was started and has exited."""
        if self.process is not None and (code := self.process.poll()) is not None:
            raise ChildDied(self.name, f"{exit_status(code)}; last lines of {self.log}:\n{tail(self.log)}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, as Kubernetes does; SIGKILL if it does not exit in time. Its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: no flush, no commit, no goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def current_output(self) -> str:
        """Output of the latest start only."""
        return self.output().rpartition(f"===== start #{self.starts} =====")[2]

    def wait_for_output(self, needle: str, timeout_s: float) -> None:
        """Wait until the latest start of the process printed ``needle``."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.current_output():
            if not self.running:
                raise ChildDied(self.name, f"exited before printing {needle!r}:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {needle!r} after {timeout_s}s:\n{self.output()[-4000:]}")
            time.sleep(0.1)


#: ``spawn(name, ["-m", "module"], env, start=True)`` → a :class:`Service` (started unless told not to).
SpawnFn = Callable[..., Service]


def spawner(
    directory: Path,
    services: list[Service],
    *,
    inherit_env: bool = True,
    own_session: bool = False,
    numbered: bool = True,
) -> SpawnFn:
    """A :data:`SpawnFn` running Python modules with this interpreter, logs in ``directory``
    (``<name>-<n>.log``, or ``<name>.log`` when not ``numbered``); every service it makes is
    appended to ``services`` (for whoever stops them)."""

    def spawn(name: str, args: list[str], env: dict[str, str], start: bool = True) -> Service:
        log = directory / (f"{name}-{len(services)}.log" if numbered else f"{name}.log")
        service = Service(name, [sys.executable, *args], env, log, inherit_env, own_session)
        services.append(service)
        return service.start() if start else service

    return spawn


@dataclass
class Environment:
    """An environment that points the services and clients at a broker."""

    env: dict[str, str]

    @property
    def common(self) -> CommonConfig:
        return CommonConfig.from_env(self.env)

    @property
    def bootstrap(self) -> str:
        return self.env["KAFKA_BOOTSTRAP_SERVERS"]


@dataclass
class Broker(Environment):
    """The broker the services run on, and the environment that points clients at it."""

    embedded: EmbeddedBroker | None = None
    #: The embedded broker's output.
    log: Path | None = None

    def describe(self, address: bool = True) -> str:
        """What the broker is; ``address=False`` leaves out the embedded one's port (random each run)."""
        if self.embedded is not None:
            where = f" on {self.bootstrap}" if address else ""
            return f"embedded Tansu{where} (memory storage)"
        return f"external cluster at {self.bootstrap} (profile {self.env['TIMERS_BROKER_PROFILE']})"

    def child_env(self, *, keep_tuning: bool) -> dict[str, str]:
        """This process's environment pointed at the broker, for a service run with ``inherit_env=False``.

        Inherited ``KAFKA_*`` settings (say, SASL for a real cluster) are dropped when the broker is
        the embedded one: they would not work against it. Inherited ``TIMERS_*`` tuning passes through
        if ``keep_tuning``, else the services run with their defaults (what a benchmark measures).
        """
        drop: tuple[str, ...] = ("KAFKA_",) if self.embedded is not None else ()
        if not keep_tuning:
            drop += ("TIMERS_",)
        base = {k: v for k, v in os.environ.items() if not k.startswith(drop)} if drop else dict(os.environ)
        return {**base, **self.env}

    def check(self) -> None:
        """Raise :class:`ChildDied` if the embedded broker has exited."""
        if self.embedded is not None and (code := self.embedded.process.poll()) is not None:
            where = f"; last lines of {self.log}:\n{tail(self.log)}" if self.log is not None else ""
            raise ChildDied("broker", exit_status(code) + where)


@contextlib.contextmanager
def open_broker(log: Path | None = None, *, external: bool = True) -> Iterator[Broker]:
    """``KAFKA_BOOTSTRAP_SERVERS`` if set (and ``external``), else an embedded broker logging to
    ``log``, stopped at exit."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") if external else None
    if bootstrap:
        env = {k: v for k, v in os.environ.items() if k.startswith("KAFKA_")}
        env["TIMERS_BROKER_PROFILE"] = os.environ.get("TIMERS_BROKER_PROFILE", "cluster")
        yield Broker(env)
        return
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    embedded = start_broker(log_path=None if log is None else str(log))
    try:
        yield Broker(embedded.env(), embedded, log)
    finally:
        embedded.stop()


def instance_env(prefix: str = "", partitions: int = 4) -> dict[str, str]:
    """Topic names and app id of a fresh service instance (``<prefix>oscillator-<random>``, …)."""
    suffix = uuid.uuid4().hex[:8]
    return {
        "TIMERS_TOPIC_OSCILLATOR": f"{prefix}oscillator-{suffix}",
        "TIMERS_TOPIC_REQUEST": f"{prefix}timer-request-{suffix}",
        "TIMERS_TOPIC_EVENTS": f"{prefix}timer-events-{suffix}",
        "TIMERS_TOPIC_DLQ": f"{prefix}timer-request-dlq-{suffix}",
        "TIMERS_PARTITIONS": str(partitions),
        "TIMERS_APP_ID": f"{prefix}timers-{suffix}",
    }


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition → {``name{label="value",…}``: value}, labels as exposed."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return samples


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def read_metrics(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """A service's metrics (:func:`parse_metrics`); raises ``OSError`` while it does not serve them."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - our own http URL
        return parse_metrics(response.read().decode())


def metric_sum(samples: Mapping[str, float], name: str) -> float:
    """``name`` summed over its labels (or one labelled sample when ``name`` has its labels)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


@dataclass
class Stack(Environment):
    """One service instance: its environment, a worker and oscillators, started by ``spawn``."""

    spawn: SpawnFn
    data_dir: Path
    web_port: int = field(default_factory=free_port)
    worker: Service | None = None
    oscillators: list[Service] = field(default_factory=list)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}/metrics"

    def create_topics(self) -> Self:
        create_topics(self.common)
        return self

    def worker_env(self) -> dict[str, str]:
        # Absolute: Faust resolves a relative table directory under its data directory.
        data_dir = str(self.data_dir.absolute())
        return {**self.env, "TIMERS_DATA_DIR": data_dir, "TIMERS_WEB_PORT": str(self.web_port)}

    def start_worker(self, wait: bool = True, timeout_s: float = 60.0) -> Service:
        """Start (or restart) the worker; ``wait``: until its table is ready."""
        if self.worker is None:
            self.worker = self.spawn("worker", ["-m", "futures.worker.main"], self.worker_env(), start=False)
        self.worker.env = self.worker_env()
        self.worker.start()
        if wait:
            self.worker.wait_for_output(WORKER_READY, timeout_s=timeout_s)
        return self.worker

    def start_oscillator(self, wait: bool = True) -> Service:
        env = {
            **self.env,
            "TIMERS_OSC_HEALTH_PORT": str(free_port()),
            "TIMERS_OSC_INSTANCE": f"osc-{len(self.oscillators)}",
        }
        osc = self.spawn(f"oscillator{len(self.oscillators)}", ["-m", "oscillator.main"], env)
        self.oscillators.append(osc)
        if wait:
            osc.wait_for_output(OSCILLATOR_READY, timeout_s=30)
        return osc

    def check(self) -> None:
        """Raise :class:`ChildDied` if the worker or an oscillator has exited."""
        for service in (self.worker, *self.oscillators):
            if service is not None:
                service.check()

    def wait_for_tick(self, timeout_s: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait until the worker fired on a tick (its clock advanced): the stack then works end to
        end. False if ``stop()`` said so first; raises :class:`ChildDied` if a service died, or
        :class:`TimeoutError`."""
        deadline = time.monotonic() + timeout_s
        while not stop():
            self.check()
            try:
                if read_metrics(self.metrics_url, timeout_s=1).get(ADVANCED_TICKS, 0.0) > 0:
                    return True
            except OSError:
                pass  # not serving yet
            if time.monotonic() > deadline:
                worker = self.worker.log if self.worker else "(no worker)"
                raise TimeoutError(f"the worker processed no tick within {timeout_s:g}s; its log: {worker}")
            time.sleep(0.2)
        return False

    def metrics(self) -> dict[str, float]:
        """The worker's Prometheus samples, by name with labels."""
        return read_metrics(self.metrics_url)

    def metric_sum(self, prefix: str) -> float:
        return metric_sum(self.metrics(), prefix)

    def poll_metric(
        self, prefix: str, predicate: Callable[[float], bool], timeout_s: float, *, check: bool = False
    ) -> float:
        """Read ``metric_sum(prefix)`` until ``predicate`` holds or ``timeout_s`` ran out; the last value
        (NaN while the worker does not answer). ``check``: raise :class:`ChildDied` if a service died."""
        deadline = time.monotonic() + timeout_s
        while True:
            if check:
                self.check()
            try:
                value = self.metric_sum(prefix)
            except OSError:
                value = float("nan")
            if predicate(value) or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def wait_for_metric(self, prefix: str, predicate: Callable[[float], bool], timeout_s: float) -> float:
        """:meth:`poll_metric`, raising :class:`TimeoutError` when the predicate never held."""
        value = self.poll_metric(prefix, predicate, timeout_s)
        if not predicate(value):
            raise TimeoutError(f"{prefix} = {value} after {timeout_s}s")
        return value

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """The worker, then the oscillators."""
        for service in (self.worker, *reversed(self.oscillators)):
            if service is not None:
                service.stop(timeout_s)
