"""values.yaml and values.schema.json: documented, in step, and strict about bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml

from tests.helm.conftest import CHART_DIR, VALUE_SETS

VALUES_TEXT = (CHART_DIR / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
# Kubernetes objects passed through whole: documented as one value, their fields are Kubernetes'.
PASS_THROUGH = {"podSecurityContext", "securityContext", "resources"}


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"oscillator": {"replicas": -1}}, "/oscillator/replicas"),
        ({"worker": {"replicas": 0}}, "/worker/replicas"),
        ({"oscillator": {"replicas": "3"}}, "/oscillator/replicas"),
        ({"worker": {"latePolicy": "later"}}, "/worker/latePolicy"),
        ({"oscillator": {"antiAffinity": "strict"}}, "/oscillator/antiAffinity"),
        ({"kafka": {"sasl": {"mechanism": "GSSAPI"}}}, "/kafka/sasl/mechanism"),
        ({"kafka": {"bootstrapServers": "kafka"}}, "/kafka/bootstrapServers"),
        ({"topics": {"names": {"request": "timer request"}}}, "/topics/names/request"),
        ({"worker": {"persistence": {"size": "ten gigs"}}}, "/worker/persistence/size"),
        (
            {"worker": {"persistence": {"retentionPolicy": {"whenScaled": "Keep"}}}},
            "/worker/persistence/retentionPolicy/whenScaled",
        ),
        ({"oscillator": {"staleAfterSeconds": 1}}, "/oscillator/staleAfterSeconds"),
        ({"metrics": {"prometheusRule": {"watermarkLag": {"for": "5 minutes"}}}}, "/metrics/prometheusRule"),
        ({"worker": {"replica": 3}}, "'replica' not allowed"),
        ({"networkPolicy": {"adminFrom": [{"podSelecter": {}}]}}, "/networkPolicy/adminFrom"),
        ({"networkPolicy": {"scrapeFrom": {"app": "prometheus"}}}, "/networkPolicy/scrapeFrom"),
        (
            {"networkPolicy": {"kafkaTo": [{"ipBlock": {"except": ["169.254.169.254/32"]}}]}},
            "/networkPolicy/kafkaTo",
        ),
        ({"networkPolicy": {"kafkaPorts": ["9092"]}}, "/networkPolicy/kafkaPorts/0"),
        ({"networkPolicy": {"extraEgress": [{"too": []}]}}, "/networkPolicy/extraEgress/0"),
        ({"worker": {"networkPolicy": {"enabled": True}}}, "'networkPolicy' not allowed"),
        ({"worker": {"metricsPort": 0}}, "/worker/metricsPort"),
        ({"tmpSizeLimit": "lots"}, "/tmpSizeLimit"),
        ({"jobs": {"tmpSizeLimit": "20 GB"}}, "/jobs/tmpSizeLimit"),
        # A security context that would run as root, privileged or with more rights: refused.
        ({"podSecurityContext": None}, "podSecurityContext"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
        ({"podSecurityContext": {"runAsUser": 0}}, "/podSecurityContext/runAsUser"),
        (
            {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
            "/podSecurityContext/seccompProfile",
        ),
        ({"securityContext": None}, "securityContext"),
        ({"securityContext": {"privileged": True}}, "/securityContext/privileged"),
        (
            {"securityContext": {"allowPrivilegeEscalation": True}},
            "/securityContext/allowPrivilegeEscalation",
        ),
        ({"securityContext": {"allowPrivilegeEscalation": None}}, "allowPrivilegeEscalation"),
        ({"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}, "/securityContext/capabilities/add"),
        ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
        ({"worker": {"schemaRegistry": {"url": "registry:8081"}}}, "/worker/schemaRegistry/url"),
        ({"worker": {"requestAllowedCallbackTopics": ["a,b"]}}, "/worker/requestAllowedCallbackTopics/0"),
        (
            {"topics": {"ingress": [{"name": "t", "format": "native", "allowedCallbackTopics": []}]}},
            "/topics/ingress/0/allowedCallbackTopics",
        ),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], where: str) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
            chart.validate_schema(values)
        # The install itself refuses them, before anything reaches the cluster.
        with pytest.raises(helm_python.HelmValuesError):
            chart.render(values, name="timers", namespace="delays")


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_schema_accepts_the_documented_value_sets(value_set: str) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(VALUE_SETS[value_set])


def _leaf_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in PASS_THROUGH:
            yield from _leaf_paths(value, path + ".")
        else:
            yield path


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, sub in schema.get("properties", {}).items():
        if "$ref" in sub:
            sub = SCHEMA["definitions"][sub["$ref"].rsplit("/", 1)[1]]
        path = f"{prefix}{key}"
        if "properties" in sub and key not in PASS_THROUGH:
            yield from _schema_paths(sub, path + ".")
        else:
            yield path


def test_schema_covers_exactly_the_values() -> None:
    """Hand-written schemas drift; this keeps values.yaml and the schema in step."""
    values = set(_leaf_paths(VALUES))
    schema = set(_schema_paths(SCHEMA)) - {"global"}
    assert values - schema == set(), "values without a schema entry"
    assert schema - values == set(), "schema entries missing from values.yaml"


def test_every_value_is_commented() -> None:
    lines = VALUES_TEXT.splitlines()
    undocumented = []
    inside: list[tuple[int, str]] = []  # (indent, key) of the enclosing blocks
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w-]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        inside = [(i, k) for i, k in inside if i < indent]
        if any(k in PASS_THROUGH for _, k in inside):
            continue
        inside.append((indent, key))
        previous = next((p for p in reversed(lines[:number]) if p.strip()), "")
        is_block = line.rstrip().endswith(":")
        # A block may go without a comment when its first child has one; every leaf needs its own.
        if not previous.lstrip().startswith("#") and not is_block:
            undocumented.append(f"line {number + 1}: {line.strip()}")
    assert undocumented == []
