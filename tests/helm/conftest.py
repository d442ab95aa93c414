"""Fixtures for the Helm chart's tests: the chart rendered offline by Helm's own Go SDK.

No cluster and no helm binary: ``helm_python`` binds Helm v4's SDK, so rendering, schema
validation and lint are Helm's, not an imitation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "kafka-timers"
RELEASE = "timers"
NAMESPACE = "delays"

# The value sets the chart is rendered and validated with, besides its defaults.
MINIMAL: dict[str, Any] = {
    "kafka": {"bootstrapServers": "broker-0.kafka:9092"},
    "oscillator": {"replicas": 2, "pdb": {"enabled": False}},
    "worker": {"replicas": 1, "pdb": {"enabled": False}},
    "metrics": {"scrapeAnnotations": False},
    "tests": {"enabled": False},
}

PRODUCTION: dict[str, Any] = {
    "image": {"repository": "registry.example/platform/kafka-timers", "digest": "sha256:" + "ab" * 32},
    "imagePullSecrets": [{"name": "registry"}],
    "kafka": {
        "bootstrapServers": "b-1.kafka.internal:9096,b-2.kafka.internal:9096,b-3.kafka.internal:9096",
        "sasl": {"enabled": True, "mechanism": "SCRAM-SHA-512", "existingSecret": "kafka-timers-credentials"},
        "tls": {"enabled": True, "caSecret": "kafka-ca", "caKey": "ca.pem"},
    },
    "topics": {
        "partitions": 24,
        "ingress": [
            {"name": "schedules", "format": "etf1"},
            {"name": "timers-team-a", "format": "native", "allowedCallbackTopics": ["team-a.*", "audit"]},
        ],
    },
    "oscillator": {
        "replicas": 3,
        "antiAffinity": "hard",
        "zoneSpread": {"enabled": True, "whenUnsatisfiable": "DoNotSchedule"},
        "priorityClassName": "system-cluster-critical",
    },
    "worker": {
        "replicas": 6,
        "allowedCallbackTopics": ["orders-*", "reminders"],
        "requestAllowedCallbackTopics": ["orders-*"],
        "schemaRegistry": {"url": "https://registry.internal:8081", "basicAuthSecret": "registry-auth"},
        "maxPayloadBytes": 5_000_000,
        "maxDueAheadSeconds": 31_536_000,
        "latePolicy": "dlq",
        "zoneSpread": {"enabled": True},
        "persistence": {"size": "50Gi", "storageClassName": "gp3"},
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "admin": {"tokenSecret": "kafka-timers-admin", "readTokenSecret": "kafka-timers-admin"},
    },
    "networkPolicy": {
        "enabled": True,
        "scrapeFrom": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
        "adminFrom": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                "podSelector": {"matchLabels": {"app": "timers-admin"}},
            },
            {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.99.0/24"]}},
        ],
        "kafkaTo": [{"ipBlock": {"cidr": "10.40.0.0/16"}}],
        "extraEgress": [
            {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]}
        ],
    },
    "tmpSizeLimit": "512Mi",
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    },
    "grafana": {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "Kafka"}}},
}

# SASL with credentials given as values: the chart creates the Secrets (one for the hook Job).
INLINE_SASL: dict[str, Any] = {
    "kafka": {"sasl": {"enabled": True, "mechanism": "PLAIN", "username": "timers", "password": "s3cr3t-pw"}},
}

COMPACTION: dict[str, Any] = {
    "jobs": {
        "sparkMaster": "local[4]",
        "tmpSizeLimit": "50Gi",
        "compaction": {"enabled": True, "args": ["--publish"], "timeZone": "Europe/Paris"},
        "replay": {"enabled": True, "args": ["--due-from", "2026-01-01T09:00:00Z"]},
    },
    "kafka": INLINE_SASL["kafka"],
}


# Precise mode (each timer sent at its own millisecond), passed as the chart's README says: worker.extraEnv.
PRECISE: dict[str, Any] = {"worker": {"extraEnv": [{"name": "TIMERS_PRECISE", "value": "1"}]}}

# More oscillators than the default three (values.yaml: oscillator.replicas), each ticking every partition.
FIVE_OSCILLATORS: dict[str, Any] = {"oscillator": {"replicas": 5}}


def _readme_value_sets() -> dict[str, dict[str, Any]]:
    """The values files the chart's README shows (its ``yaml`` blocks), each a value set of its own."""
    text = (CHART_DIR / "README.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    return {f"readme-{number}": yaml.safe_load(block) for number, block in enumerate(blocks, 1)}


VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "minimal": MINIMAL,
    "production": PRODUCTION,
    "inline-sasl": INLINE_SASL,
    "compaction": COMPACTION,
    "precise": PRECISE,
    "five-oscillators": FIVE_OSCILLATORS,
    **_readme_value_sets(),
}


@dataclass(frozen=True)
class Manifest:
    """One rendered Kubernetes object and the template it came from."""

    template: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        meta = self.obj["metadata"]
        return str(meta.get("name") or meta.get("generateName"))

    @property
    def hook(self) -> str | None:
        return (self.obj["metadata"].get("annotations") or {}).get("helm.sh/hook")


@dataclass(frozen=True)
class Rendered:
    manifests: list[Manifest]
    notes: str

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m.kind == kind]

    def one(self, kind: str, name_suffix: str) -> dict[str, Any]:
        found = [m.obj for m in self.of_kind(kind) if m.name.endswith(name_suffix)]
        assert len(found) == 1, f"{kind} *{name_suffix}: {[m.name for m in self.of_kind(kind)]}"
        return found[0]


@pytest.fixture(scope="session")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART_DIR) as loaded:
        yield loaded


RenderFn = Callable[[dict[str, Any]], Rendered]


@pytest.fixture(scope="session")
def render(chart: helm_python.Chart) -> RenderFn:
    """``render(values)`` → every object the chart produces, hooks and tests included."""

    def _render(values: dict[str, Any]) -> Rendered:
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        manifests = [
            Manifest(path, obj)
            for path, text in sorted(out.items())
            if path.endswith(".yaml")
            for obj in yaml.safe_load_all(text)
            if obj
        ]
        notes = next((text for path, text in out.items() if path.endswith("NOTES.txt")), "")
        return Rendered(manifests, notes)

    return _render


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a Pod, or of the pod template of a workload (CronJob included)."""
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    if obj["kind"] != "Pod":
        spec = spec["template"]["spec"]
    return list(spec["containers"])


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec if obj["kind"] == "Pod" else spec["template"]["spec"]
