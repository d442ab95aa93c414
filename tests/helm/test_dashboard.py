"""The Grafana dashboard: shipped off by default, loadable by Grafana's sidecar, and every query it runs
names a metric the services export, and returns data on what they export."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import helm_python
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.helm.conftest import CHART_DIR, NAMESPACE, RenderFn

DASHBOARD_TEXT = (CHART_DIR / "files" / "grafana-dashboard.json").read_text()
DASHBOARD: dict[str, Any] = json.loads(DASHBOARD_TEXT)
ON: dict[str, Any] = {"grafana": {"dashboard": {"enabled": True}}}
PROMTOOL = shutil.which("promtool")
# Written by Prometheus itself for every scrape target, not by the services.
PROMETHEUS_SERIES = {"up"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def service_registries() -> dict[str, CollectorRegistry]:
    """Fresh registries of the worker's and the oscillator's own metric classes, each series touched once.

    The one place that knows where those classes live.
    """
    from futures.worker.metrics import WorkerMetrics
    from futures.worker.table import TableSizes
    from oscillator.metrics import OscillatorMetrics

    worker = WorkerMetrics()
    # Stand-ins for the RocksDB tables: the collector reads only these.
    sizes = TableSizes(sst=1 << 20, memtables=1 << 16, compaction_pending=0)
    tables: Any = {
        0: SimpleNamespace(pending=3, watermark=1_000, sizes=lambda: sizes),
        1: SimpleNamespace(pending=5, watermark=1_000, sizes=lambda: sizes),
    }
    worker.watch_tables(lambda: tables)
    # Labelled series exist once a label value has been seen; the others are exported from the start.
    worker.rejected.labels(reason="invalid-request").inc()
    worker.ticks.labels(outcome="advanced").inc()
    worker.fired.inc()
    worker.lateness.observe(0.3)
    oscillator = OscillatorMetrics()
    oscillator.delivered(1_000)
    oscillator.failed()
    return {"worker": worker.registry, "oscillator": oscillator.registry}


# The series names a metric family of each type puts in the text exposition.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


def exported_names() -> set[str]:
    """Every series name the worker and the oscillator can export, labelled or not, seen yet or not."""
    names: set[str] = set()
    for registry in service_registries().values():
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_VARIABLE = re.compile(r"\$\{?\w+\}?")
# A name that is not part of a longer word or number and is not called like a function.
_NAME = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana's $variables allowed anywhere)."""
    for pattern in (_STRING, _MATCHERS, _RANGE, _GROUPING, _VARIABLE):
        expr = pattern.sub(" ", expr)
    return {name for name in _NAME.findall(expr) if name.lower() not in _KEYWORDS}


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # the panels of a collapsed row


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every query the dashboard runs: panel targets and query variables."""
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            # label_values(<series selector>, <label>): only the selector is PromQL.
            selector = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert selector is not None, f"variable {variable['name']}: {query}"
            yield f"variable ${variable['name']}", selector.group(1)


def unknown_metrics(dashboard: dict[str, Any], known: set[str]) -> list[str]:
    return [
        f"{where}: {name}"
        for where, expr in queries(dashboard)
        for name in sorted(promql_metric_names(expr) - known - PROMETHEUS_SERIES)
    ]


# -- the chart ---------------------------------------------------------------------------------------


def _dashboard_configmaps(rendered: Any) -> list[dict[str, Any]]:
    return [m.obj for m in rendered.of_kind("ConfigMap") if m.template.endswith("grafana-dashboard.yaml")]


def test_no_dashboard_unless_asked(render: RenderFn) -> None:
    rendered = render({})
    assert _dashboard_configmaps(rendered) == []
    labelled = [
        m.name for m in rendered.of_kind("ConfigMap") if "grafana_dashboard" in m.obj["metadata"]["labels"]
    ]
    assert labelled == []
    assert "Grafana" not in rendered.notes


def test_enabled_dashboard_is_a_configmap_the_sidecar_picks_up(render: RenderFn) -> None:
    rendered = render(ON)
    (cm,) = _dashboard_configmaps(rendered)
    meta = cm["metadata"]
    assert meta["name"] == "timers-kafka-timers-dashboard"
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert "namespace" not in meta  # the release's
    ((key, text),) = cm["data"].items()
    assert key.endswith(".json")  # the sidecar writes each key as a file; Grafana loads *.json
    assert json.loads(text) == DASHBOARD  # whole, and untouched by Helm's templating
    assert "{{pod}}" in text
    # Client-side `kubectl apply` keeps a copy in an annotation limited to 256 KiB.
    assert len(text.encode()) < 256 * 1024
    # The install notes say where it is and what to pick in it.
    assert "ConfigMap timers-kafka-timers-dashboard" in rendered.notes
    assert 'release "timers-kafka-timers"' in rendered.notes


def test_label_namespace_and_annotations_are_values(render: RenderFn) -> None:
    values = {
        "grafana": {
            "dashboard": {
                "enabled": True,
                "label": "example.com/dashboard",
                "labelValue": "kafka",
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "Kafka"},
            }
        }
    }
    (cm,) = _dashboard_configmaps(render(values))
    meta = cm["metadata"]
    assert meta["labels"]["example.com/dashboard"] == "kafka"
    assert "grafana_dashboard" not in meta["labels"]
    assert meta["namespace"] == "monitoring"
    assert meta["annotations"] == {"grafana_folder": "Kafka"}


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"label": "grafana dashboard"}, "/grafana/dashboard/label"),
        ({"labelValue": 1}, "/grafana/dashboard/labelValue"),
        ({"namespace": "Monitoring"}, "/grafana/dashboard/namespace"),
        ({"folder": "Kafka"}, "'folder' not allowed"),
    ],
)
def test_schema_rejects_bad_dashboard_values(values: dict[str, Any], where: str) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
            chart.validate_schema({"grafana": {"dashboard": {"enabled": True, **values}}})


def test_release_variable_finds_the_release_from_its_pod_names(render: RenderFn) -> None:
    rendered = render(ON)
    worker_pod = rendered.one("StatefulSet", "-worker")["metadata"]["name"] + "-0"
    oscillator = rendered.one("Deployment", "-oscillator")["metadata"]["name"]
    (release,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "release"]
    found = re.fullmatch(release["regex"].strip("/"), worker_pod)
    assert found is not None and found.group(1) == "timers-kafka-timers"
    # The panels select pods by "$release-.*": both components, with the names the chart gives them.
    assert oscillator.startswith(found.group(1) + "-")


# -- the dashboard JSON --------------------------------------------------------------------------------


def _datasources(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from _datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from _datasources(item)


def test_dashboard_is_what_grafana_provisions() -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", DASHBOARD["uid"])
    assert DASHBOARD["title"] == "kafka-timers"
    assert DASHBOARD["schemaVersion"] >= 36
    # A provisioned dashboard gets its id from Grafana; an exported one's __inputs (${DS_...}) would
    # never be filled in by the sidecar.
    assert DASHBOARD.get("id") is None
    assert "__inputs" not in DASHBOARD and "${DS_" not in DASHBOARD_TEXT
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # No fixed data source anywhere: the one the user picks, or Grafana's built-in annotations.
    for datasource in _datasources(DASHBOARD):
        assert datasource == DATASOURCE or datasource == {"type": "grafana", "uid": "-- Grafana --"}, (
            datasource
        )

    ids: set[int] = set()
    cells: set[tuple[int, int]] = set()
    for panel in _panels(DASHBOARD):
        assert panel["id"] not in ids, f"panel id {panel['id']} twice"
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        area = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not area & cells, f"{panel['title']!r} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"stat", "timeseries", "heatmap", "bargauge"}, panel["type"]
        assert panel["title"] and panel["description"]
        targets = panel["targets"]
        assert targets, f"{panel['title']!r} has no query"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        assert all(t["expr"].strip() for t in targets), panel["title"]


def test_dashboard_covers_what_an_operator_watches() -> None:
    exprs = " ".join(expr for _, expr in queries(DASHBOARD))
    titles = [p["title"] for p in _panels(DASHBOARD)]
    assert "Pending timers per partition" in titles
    assert "by (partition) (timers_pending" in exprs
    assert "rate(timers_fired_total" in exprs
    assert "histogram_quantile(0.99, sum by (le) (rate(timers_fire_lateness_seconds_bucket" in exprs
    heatmaps = [p for p in _panels(DASHBOARD) if p["type"] == "heatmap"]
    assert [t["expr"] for p in heatmaps for t in p["targets"]] == [
        'sum by (le) (increase(timers_fire_lateness_seconds_bucket{namespace="$namespace", '
        'pod=~"$release-.*"}[$__rate_interval]))'
    ]
    assert heatmaps[0]["targets"][0]["format"] == "heatmap"
    assert "sum by (reason) (increase(timers_rejected_total" in exprs
    assert "timers_watermark_seconds" in exprs
    assert "timers_oscillator_last_second_delivered" in exprs
    assert "rate(timers_scheduled_total" in exprs  # ingest
    assert 'up{namespace="$namespace", pod=~"$release-worker-.*"}' in exprs


# -- the queries against the services' metrics --------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (le) (rate(timers_fire_lateness_seconds_bucket{pod=~"$release-.*"}[$__rate_interval]))',
            {"timers_fire_lateness_seconds_bucket"},
        ),
        (
            "time() - max by (partition) (timers_watermark_seconds{ns='x'}) > bool 5 or vector(0)",
            {"timers_watermark_seconds"},
        ),
        (
            "rate(a_total[5m] offset 1h) / ignoring(reason) group_left b_count unless on(pod) c",
            {"a_total", "b_count", "c"},
        ),
        ('histogram_quantile(0.99, x_bucket{le="+Inf"}) * 1e3 + Inf', {"x_bucket"}),
    ],
)
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_exported_names_match_a_scrape() -> None:
    """The suffix table above agrees with what prometheus_client really writes."""
    known = exported_names()
    for registry in service_registries().values():
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                assert sample.name in known, sample.name
    assert {"timers_pending", "timers_fired_total", "timers_fire_lateness_seconds_bucket"} <= known
    assert "timers_oscillator_last_second_delivered" in known


def test_every_query_names_metrics_the_services_export() -> None:
    assert unknown_metrics(DASHBOARD, exported_names()) == []


def test_a_query_naming_a_missing_metric_is_caught() -> None:
    mutated = copy.deepcopy(DASHBOARD)
    (panel,) = [p for p in _panels(mutated) if p["title"] == "Fire rate per worker"]
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace(
        "timers_fired_total", "timers_fires_total"
    )
    assert unknown_metrics(mutated, exported_names()) == [
        "panel 'Fire rate per worker' A: timers_fires_total"
    ]


# What Grafana substitutes before a query reaches Prometheus (the range ones for 1-minute samples).
_GRAFANA_VARIABLES = {
    "$namespace": NAMESPACE,
    "$release": "timers-kafka-timers",
    "$__rate_interval": "2m",
    "$__range": "20m",
}


def _as_prometheus_gets_it(expr: str) -> str:
    for variable, value in _GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def _input_series(render: RenderFn) -> list[dict[str, str]]:
    """The series Prometheus holds after scraping one worker and one oscillator of the release for 30 min."""
    rendered = render(ON)
    pods = {
        "worker": rendered.one("StatefulSet", "-worker")["metadata"]["name"] + "-0",
        "oscillator": rendered.one("Deployment", "-oscillator")["metadata"]["name"] + "-5d8c7b9f4-x2kqp",
    }
    series = []
    for component, registry in service_registries().items():
        target = {"namespace": NAMESPACE, "pod": pods[component]}
        series.append({"series": _selector("up", target), "values": "1+0x30"})
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                value = sample.value
                # Counters grow by their scraped value each minute; gauges stay put.
                values = f"{value:g}+0x30" if family.type == "gauge" else f"0+{value:g}x30"
                series.append(
                    {"series": _selector(sample.name, {**sample.labels, **target}), "values": values}
                )
    return series


def _selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


@pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool is not installed: `make promtool` (Debian package prometheus)",
)
def test_every_query_returns_data_from_what_the_services_export(render: RenderFn, tmp_path: Path) -> None:
    """Each query, run by Prometheus' engine (promtool) on the series the services really export, is
    valid PromQL and not empty: a wrong metric name, label matcher or pod selector shows up here."""
    assert PROMTOOL is not None, "promtool is missing: run `make promtool`"
    where = dict(enumerate(queries(DASHBOARD)))
    rules = [
        {"alert": f"Q{i}", "expr": f"absent({_as_prometheus_gets_it(expr)})"}
        for i, (_, expr) in where.items()
    ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    spec = {
        "rule_files": ["queries.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _input_series(render),
                "alert_rule_test": [
                    {"alertname": f"Q{i}", "eval_time": "20m", "exp_alerts": []} for i in where
                ],
            }
        ],
    }
    (tmp_path / "queries_test.yaml").write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "queries_test.yaml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    empty = [where[int(i)][0] for i in re.findall(r"alertname: Q(\d+)", result.stdout + result.stderr)]
    assert result.returncode == 0, f"empty: {empty}\n{result.stdout}{result.stderr}"
