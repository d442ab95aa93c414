"""The chart lints, renders with every value set, and every object validates against Kubernetes."""

from __future__ import annotations

import re
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest

from tests.helm.conftest import CHART_DIR, VALUE_SETS, RenderFn
from tests.helm.crd_schemas import CRD_SCHEMAS

# The chart's kubeVersion floor (Chart.yaml), and the newest schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version())


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_lint_has_no_errors_or_warnings(value_set: str) -> None:
    report = helm_python.lint(CHART_DIR, VALUE_SETS[value_set], strict=True, kube_version="v1.25.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], problems


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_manifest_is_valid_kubernetes(render: RenderFn, value_set: str) -> None:
    rendered = render(VALUE_SETS[value_set])
    assert rendered.manifests
    for manifest in rendered.manifests:
        obj = manifest.obj
        crd_schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        try:
            if crd_schema is not None:
                jsonschema.validate(obj, crd_schema)
                continue
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{manifest.template}: {manifest.kind} {manifest.name}: at {where}: {exc.message}")


def test_default_install_has_every_component(render: RenderFn) -> None:
    kinds: dict[str, list[str]] = {}
    for m in render({}).manifests:
        kinds.setdefault(m.kind, []).append(m.name)
    assert sorted(kinds) == [
        "ConfigMap",
        "Deployment",
        "Job",
        "NetworkPolicy",
        "Pod",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    ], kinds
    # Off by default: Spark jobs, Prometheus Operator objects, a chart-made Secret.
    assert not {"CronJob", "ServiceMonitor", "PrometheusRule", "Secret", "PersistentVolumeClaim"} & set(kinds)


def _names(rendered: Any) -> list[str]:
    return [f"{m.kind}/{m.name}" for m in rendered.manifests]


def test_optional_parts_render_when_enabled(render: RenderFn) -> None:
    production = _names(render(VALUE_SETS["production"]))
    assert "ServiceMonitor/timers-kafka-timers" in production
    assert "PrometheusRule/timers-kafka-timers" in production
    assert "ConfigMap/timers-kafka-timers-dashboard" in production
    compaction = _names(render(VALUE_SETS["compaction"]))
    assert "CronJob/timers-kafka-timers-compact" in compaction
    # Named by its render time: every `helm template ... | kubectl create` is a new Job.
    assert any(re.fullmatch(r"Job/timers-kafka-timers-replay-\d{8}-\d{6}", n) for n in compaction), compaction
    assert "PersistentVolumeClaim/timers-kafka-timers-snapshots" in compaction
