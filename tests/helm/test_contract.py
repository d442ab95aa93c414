"""The chart and the code agree: the environment it sets is what each component accepts, the
commands it runs exist, and nothing turns on the embedded-broker workarounds in a cluster."""

from __future__ import annotations

import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from futures.worker.config import LatePolicy, WorkerConfig
from ktimers.config import BrokerProfile, CommonConfig
from oscillator.config import OscillatorConfig
from tests.helm.conftest import NAMESPACE, REPO, VALUE_SETS, Rendered, RenderFn, containers

CONSOLE_SCRIPTS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job", "CronJob", "Pod"}


#: What the kubelet gives ``fieldRef: metadata.name`` here: a StatefulSet pod's name.
POD_NAME = "timers-worker-0"
#: What a Secret's key holds here, for each variable its own: a token long enough, and a user:password.
SECRET_STUB = "stubbed-{name}:stubbed-secret-value"


#: Where a container's mounted files are stubbed: each mount path mirrored under this folder.
MOUNTED_FILES = Path(tempfile.mkdtemp(prefix="chart-mounted-files-"))


def container_env(rendered: Rendered, container: dict[str, Any]) -> dict[str, str]:
    """The environment a container starts with, as the kubelet would build it (Secrets stubbed).

    ``$(NAME)`` references are expanded as the kubelet does. A ``*_FILE`` variable naming a file
    under one of the container's mounts is pointed at a stub of that file; one naming a file
    outside them is left as it is, so that the component's loader fails on it as in the pod.
    """
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(rendered.one("ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        field = source.get("fieldRef", {}).get("fieldPath")
        default = POD_NAME if field == "metadata.name" else f"<{item['name']} from the API>"
        if "secretKeyRef" in source:
            default = SECRET_STUB.format(name=item["name"].lower())
        value = item.get("value", default)
        env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)
    mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts", [])]
    for name, value in env.items():
        if name.endswith("_FILE") and any(value.startswith(mount) for mount in mounts):
            stub = MOUNTED_FILES / value.lstrip("/")
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text(SECRET_STUB.format(name=name.removesuffix("_FILE").lower()) + "\n")
            env[name] = str(stub)
    return env


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_components_accept_the_environment_the_chart_gives_them(render: RenderFn, value_set: str) -> None:
    rendered = render(VALUE_SETS[value_set])
    (osc,) = containers(rendered.one("Deployment", "-oscillator"))
    osc_config = OscillatorConfig.from_env(container_env(rendered, osc))
    assert osc_config.health_host == "0.0.0.0"  # noqa: S104 - probes come from outside the pod
    assert osc_config.health_port == osc["ports"][0]["containerPort"]

    (worker,) = containers(rendered.one("StatefulSet", "-worker"))
    config = WorkerConfig.from_env(container_env(rendered, worker))
    assert config.web_host == "0.0.0.0"  # noqa: S104
    assert config.web_port == worker["ports"][0]["containerPort"]
    assert config.data_dir == Path("/var/lib/kafka-timers/data")
    # Static membership from the pod name, stable across the pod's restarts.
    assert config.instance_id == POD_NAME

    (topics,) = containers(rendered.one("Job", "-topics"))
    assert CommonConfig.from_env(container_env(rendered, topics)) == config.common


def test_values_reach_the_worker_exactly(render: RenderFn) -> None:
    rendered = render(VALUE_SETS["production"])
    (worker,) = containers(rendered.one("StatefulSet", "-worker"))
    config = WorkerConfig.from_env(container_env(rendered, worker))
    # Large numbers survive Helm's float64 values (1e+06 would not parse as an integer).
    assert config.max_payload_bytes == 5_000_000
    assert config.max_due_ahead_s == 31_536_000
    assert config.late_policy is LatePolicy.DLQ
    assert config.common.topics.partitions == 24
    topics = config.common.topics
    assert [(name, fmt.value) for name, fmt in topics.ingress] == [
        ("schedules", "etf1"),
        ("timers-team-a", "native"),
    ]
    assert topics.ingress_callback_topics == (("timers-team-a", ("team-a.*", "audit")),)
    # The helm test schedules through the request topic: its callback topic is let through.
    assert config.request_allowed_callback_topics == ("orders-*", "kafka-timers-helm-test")
    assert config.schema_registry is not None
    assert config.schema_registry.url == "https://registry.internal:8081"
    assert config.schema_registry.basic_auth is not None  # read from the Secret (stubbed here)
    assert config.admin_token is not None  # read from the Secret (stubbed here)
    assert config.admin_read_token is not None
    # The topic Job creates and checks the ingress topic along with the others.
    (topics,) = containers(rendered.one("Job", "-topics"))
    assert CommonConfig.from_env(container_env(rendered, topics)).topics == config.common.topics
    kafka = config.common.kafka
    assert kafka.security_protocol == "SASL_SSL"
    assert kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert kafka.bootstrap_servers.count(",") == 2


def test_cluster_profile_everywhere(render: RenderFn) -> None:
    """The embedded-broker workarounds (short sessions, replication 1) must never reach a cluster."""
    for value_set in VALUE_SETS.values():
        rendered = render(value_set)
        for m in rendered.manifests:
            assert "TIMERS_BROKER_PROFILE" not in str(m.obj), f"{m.kind} {m.name}"
            if m.kind in WORKLOAD_KINDS:
                for c in containers(m.obj):
                    env = container_env(rendered, c)
                    if "KAFKA_BOOTSTRAP_SERVERS" in env:
                        assert CommonConfig.from_env(env).kafka.profile is BrokerProfile.CLUSTER


def test_every_command_is_an_installed_entry_point(render: RenderFn) -> None:
    commands: set[str] = set()
    for value_set in VALUE_SETS.values():
        for m in render(value_set).manifests:
            if m.kind in WORKLOAD_KINDS:
                commands.update(c["command"][0] for c in containers(m.obj))
    # python: the helm test pod runs the chart's script with the image's interpreter.
    assert commands - {"python"} <= CONSOLE_SCRIPTS
    assert {"timers-oscillator", "timers-worker", "timers", "timers-compact", "timers-replay"} <= commands


def test_each_worker_advertises_its_own_pod_dns_name(render: RenderFn) -> None:
    """The admin API names the worker holding a partition by the URL each worker gives the group."""
    rendered = render({"worker": {"port": 7070}})
    sts = rendered.one("StatefulSet", "-worker")
    (worker,) = containers(sts)
    config = WorkerConfig.from_env(container_env(rendered, worker))
    assert config.web_host == "0.0.0.0"  # noqa: S104 - what it binds: no other worker can reach that
    # <pod>.<headless Service>.<namespace>.svc: the StatefulSet's stable DNS name of this very pod.
    service = rendered.one("Service", "-worker")
    assert (
        service["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == service["metadata"]["name"]
    )
    assert config.canonical_url == f"http://{POD_NAME}.{service['metadata']['name']}.{NAMESPACE}.svc:7070"
    # Each pod its own: the name comes from the pod, not from values.
    env = {e["name"]: e for e in worker["env"]}
    assert "$(TIMERS_INSTANCE_ID)" in env["TIMERS_ADVERTISED_URL"]["value"]
    assert list(env).index("TIMERS_INSTANCE_ID") < list(env).index("TIMERS_ADVERTISED_URL")  # kubelet order
