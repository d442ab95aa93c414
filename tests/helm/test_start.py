"""The worker and the oscillator start with the environment each rendered manifest gives them.

For every value set the chart is tested with (tests/helm/conftest.py: the README's and values.yaml's
TLS, SASL, precise mode, the jobs, five oscillators, …), the chart is rendered and its worker and
oscillator containers are started here as processes, as the kubelet would start them: the
manifest's command, the environment built from its ``env`` and ``envFrom`` (the ConfigMaps of the
same manifest), Secrets and mounted files stubbed (:func:`tests.helm.test_contract.container_env`).
Then each must become ready through the probe its manifest names (``readinessProbe``: path and
port), or, where the broker cannot speak the protocol, wait.

What differs from a pod, because it cannot be the same on one machine, and nothing else:

* ``KAFKA_BOOTSTRAP_SERVERS`` is the test broker, and ``TIMERS_BROKER_PROFILE`` its profile (one
  embedded broker cannot hold the three replicas a cluster's topics get).
* A path under one of the container's volume mounts is moved under a folder of the test, as the
  pod's volume would hold it; the TLS CA file holds a real PEM bundle (certifi's).
* Each ``containerPort`` moves to a free port of this machine (a pod has a network namespace of its
  own), and the variable that names it follows; the probes ask the moved port.
* Topic names and the app id get a suffix per started instance: the instances share one broker.
* ``TIMERS_SCHEMA_REGISTRY_URL`` names a closed port on 127.0.0.1: there is no registry here (the
  worker asks it about framed requests only).

Value sets that render the same environment start once. The embedded broker listens in PLAINTEXT
only: a value set with SASL or TLS must start, pass its configuration checks (a bad one exits with
one line and status 2), and **wait**: still running, live (``/healthz`` 200), not ready (its
readiness probe 503), having said once that it cannot reach Kafka at the broker. Every instance
runs at once, and each is stopped with SIGTERM, as Kubernetes stops a pod, and must exit 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import certifi
import pytest

from ktimers.broker import free_port
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from tests.helm.conftest import VALUE_SETS, Rendered, RenderFn, containers
from tests.helm.test_contract import container_env
from tools.stack import Service, spawner

pytestmark = pytest.mark.integration

#: The two services, by the workload that runs each.
COMPONENTS = {"worker": ("StatefulSet", "-worker"), "oscillator": ("Deployment", "-oscillator")}
#: Protocols the test broker speaks: the embedded one has a PLAINTEXT listener only.
SPOKEN = {"PLAINTEXT"}
#: Renamed per instance, so that instances sharing the broker share no topic and no group.
INSTANCE_NAMES = (
    "TIMERS_TOPIC_OSCILLATOR",
    "TIMERS_TOPIC_REQUEST",
    "TIMERS_TOPIC_EVENTS",
    "TIMERS_TOPIC_DLQ",
    "TIMERS_APP_ID",
)
#: What a waiting service says (ktimers.topics), and how long they all have to get there.
WAITING = "waiting: cannot reach Kafka at {bootstrap}"
DEADLINE_S = 120.0
#: A waiting service is watched at least this long: past its first retry (5 s), still not ready.
WATCH_WAITING_S = 8.0


@dataclass
class Pod:
    """One container of a rendered workload, started here."""

    component: str
    value_sets: list[str]
    command: list[str]
    env: dict[str, str]
    ready_path: str
    ready_port: int
    live_path: str
    waits: bool
    service: Service | None = None
    ready_after_s: float | None = None
    statuses: dict[str, int | str] = field(default_factory=dict)
    exit_code: int | None = None


def _probe(container: dict[str, Any], kind: str) -> dict[str, Any]:
    probe = container.get(kind)
    assert probe, f"{container['name']}: no {kind} to check"
    return dict(probe["httpGet"])


def _container_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


def _localize(env: dict[str, str], container: dict[str, Any], root: Path) -> dict[int, int]:
    """Move mounted paths under ``root`` and container ports to free ones; the ports moved."""
    mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts", [])]
    for name, value in env.items():
        # *_FILE variables are stubbed by container_env already.
        if name.endswith("_FILE") or not any(value.startswith(m) for m in mounts):
            continue
        moved = root / value.lstrip("/")
        moved.parent.mkdir(parents=True, exist_ok=True)
        if name == "KAFKA_SSL_CA_LOCATION":
            shutil.copyfile(certifi.where(), moved)
        env[name] = str(moved)
    ports = {int(p["containerPort"]): free_port() for p in container.get("ports", [])}
    for container_port, port in ports.items():
        named = [n for n, v in env.items() if n.endswith("_PORT") and v == str(container_port)]
        assert named, f"{container['name']}: no variable sets port {container_port}, the code's default would"
        for name in named:
            env[name] = str(port)
    return ports


def _instance_env(env: dict[str, str], suffix: str, bootstrap: dict[str, str]) -> None:
    env.update(bootstrap)
    for name in INSTANCE_NAMES:
        if name in env:
            env[name] = f"{env[name]}-{suffix}"
    if env.get("TIMERS_INGRESS_TOPICS"):
        env["TIMERS_INGRESS_TOPICS"] = re.sub(
            r"(^|,)([^=,]+)=", lambda m: f"{m.group(1)}{m.group(2)}-{suffix}=", env["TIMERS_INGRESS_TOPICS"]
        )
    if "TIMERS_SCHEMA_REGISTRY_URL" in env:
        env["TIMERS_SCHEMA_REGISTRY_URL"] = f"https://127.0.0.1:{free_port()}"


def _pods(render: RenderFn, broker_env: dict[str, str], root: Path) -> list[Pod]:
    """The worker and oscillator of each distinct rendered environment, ready to start."""
    by_env: dict[str, list[tuple[str, Rendered]]] = {}
    for value_set, values in sorted(VALUE_SETS.items()):
        rendered = render(values)
        envs = {}
        for component, (kind, suffix) in COMPONENTS.items():
            (container,) = containers(rendered.one(kind, suffix))
            env = container_env(rendered, container)
            env.pop("KAFKA_BOOTSTRAP_SERVERS")  # replaced below: what runs is the same without it
            envs[component] = [container["command"], container.get("args", []), env]
        by_env.setdefault(json.dumps(envs, sort_keys=True), []).append((value_set, rendered))
    pods = []
    for number, groups in enumerate(by_env.values()):
        names = [name for name, _ in groups]
        rendered = groups[0][1]
        suffix = f"{number}-{uuid.uuid4().hex[:6]}"
        for component, (kind, name_suffix) in COMPONENTS.items():
            (container,) = containers(rendered.one(kind, name_suffix))
            env = container_env(rendered, container)
            ports = _localize(env, container, root / f"{suffix}-{component}")
            _instance_env(env, suffix, broker_env)
            ready = _probe(container, "readinessProbe")
            live = _probe(container, "livenessProbe")
            assert ready["port"] == live["port"], "one port moved per probe"
            pods.append(
                Pod(
                    component,
                    names,
                    [*container["command"], *container.get("args", [])],
                    env,
                    ready["path"],
                    ports[_container_port(container, ready["port"])],
                    live["path"],
                    waits=env["KAFKA_SECURITY_PROTOCOL"] not in SPOKEN,
                )
            )
    return pods


def _status(port: int, path: str) -> int | str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__


def _settled(pod: Pod, elapsed_s: float) -> bool:
    assert pod.service is not None
    if not pod.service.running:
        return True
    if not pod.waits:
        return pod.ready_after_s is not None
    said = WAITING.format(bootstrap=pod.env["KAFKA_BOOTSTRAP_SERVERS"]) in pod.service.output()
    return said and elapsed_s >= WATCH_WAITING_S


@pytest.fixture(scope="module")
def pods(
    render: RenderFn, broker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Pod]]:
    """Every distinct environment's worker and oscillator, started at once, watched, then stopped."""
    root = tmp_path_factory.mktemp("pods")
    found = _pods(render, broker_env, root)
    services: list[Service] = []
    # The pod's environment, not this process's: only what finds the interpreter and our modules.
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")}
    spawn = spawner(root, services, inherit_env=False)
    try:
        for pod in found:
            if pod.component == "worker" and not pod.waits:
                create_topics(CommonConfig.from_env(pod.env))  # as the chart's hook Job does
        for pod in found:
            script = str(Path(sys.executable).with_name(pod.command[0]))
            pod.service = spawn(
                f"{pod.component}-{pod.value_sets[0]}", [script, *pod.command[1:]], base | pod.env
            )
        start = time.monotonic()
        while time.monotonic() - start < DEADLINE_S:
            elapsed = time.monotonic() - start
            for pod in found:
                if pod.ready_after_s is None and _status(pod.ready_port, pod.ready_path) == 200:
                    pod.ready_after_s = elapsed
            if all(_settled(pod, elapsed) for pod in found):
                break
            time.sleep(0.5)
        for pod in found:
            pod.statuses = {
                "ready": _status(pod.ready_port, pod.ready_path),
                "live": _status(pod.ready_port, pod.live_path),
            }
        # SIGTERM to every one, then wait: they stop side by side, as a release's pods do.
        for service in services:
            if service.running and service.process is not None:
                service.process.send_signal(signal.SIGTERM)
        for pod in found:
            assert pod.service is not None and pod.service.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):  # left as None, killed below
                pod.exit_code = pod.service.process.wait(timeout=30)
        yield found
    finally:
        for service in services:
            service.kill()


def _pods_of(pods: list[Pod], value_set: str) -> list[Pod]:
    mine = [pod for pod in pods if value_set in pod.value_sets]
    assert sorted(pod.component for pod in mine) == ["oscillator", "worker"]
    return mine


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_each_service_starts_with_the_environment_its_manifest_gives(pods: list[Pod], value_set: str) -> None:
    for pod in _pods_of(pods, value_set):
        assert pod.service is not None
        log = pod.service.output()[-4000:]
        where = f"{pod.component} of {value_set} (as {', '.join(pod.value_sets)}):\n{log}"
        if pod.waits:
            # The broker does not speak its protocol: configured, alive, waiting, never ready.
            assert pod.ready_after_s is None, where
            assert pod.statuses == {"ready": 503, "live": 200}, where
            assert WAITING.format(bootstrap=pod.env["KAFKA_BOOTSTRAP_SERVERS"]) in log, where
        else:
            assert pod.ready_after_s is not None, f"not ready after {DEADLINE_S:.0f} s: {where}"
            assert pod.statuses == {"ready": 200, "live": 200}, where
        assert pod.exit_code == 0, f"SIGTERM: exit {pod.exit_code}: {where}"


def test_every_protocol_the_chart_sets_is_started(pods: list[Pod]) -> None:
    """The value sets reach both outcomes: some services ready, some waiting on SASL or TLS."""
    protocols = {pod.env["KAFKA_SECURITY_PROTOCOL"] for pod in pods}
    assert {"PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"} <= protocols
    assert any(pod.env.get("TIMERS_PRECISE") == "1" and not pod.waits for pod in pods)
