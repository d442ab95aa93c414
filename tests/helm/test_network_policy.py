"""The NetworkPolicies: on by default; Prometheus reaches the metrics only, the admin peers the admin
API only; the release's pods reach Kafka, DNS and what the operator adds, never the metadata endpoint."""

from __future__ import annotations

import ipaddress
from typing import Any

from tests.helm.conftest import PRODUCTION, Rendered, RenderFn, containers

PROMETHEUS = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
OPS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
    "podSelector": {"matchLabels": {"app": "timers-admin"}},
}
METADATA = ipaddress.ip_address("169.254.169.254")


def policies(rendered: Rendered) -> dict[str, dict[str, Any]]:
    """Policies by name suffix: "" (every pod of the release), "-worker", "-oscillator"."""
    prefix = "timers-kafka-timers"
    return {m.name.removeprefix(prefix): m.obj for m in rendered.of_kind("NetworkPolicy")}


def admitted(policy: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """(port, peers) of every ingress rule; every rule must name its port and its peers."""
    rules = []
    for rule in policy["spec"].get("ingress", []):
        assert rule.get("from"), "a rule without peers admits every source"
        (port,) = [p["port"] for p in rule["ports"]]
        rules.append((port, rule["from"]))
    return rules


def selects(policy: dict[str, Any], workload: dict[str, Any]) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"] if "template" in workload["spec"] else {}
    if workload["kind"] == "Pod":
        labels = workload["metadata"]["labels"]
    if workload["kind"] == "CronJob":
        labels = workload["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return bool(policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items())


def port_of(container: dict[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == name))


def test_prometheus_reaches_the_metrics_port_and_admins_the_admin_port(render: RenderFn) -> None:
    rendered = render(PRODUCTION)
    found = policies(rendered)
    sts, osc = rendered.one("StatefulSet", "-worker"), rendered.one("Deployment", "-oscillator")
    (worker,) = containers(sts)
    (oscillator,) = containers(osc)
    np = PRODUCTION["networkPolicy"]
    assert selects(found["-worker"], sts) and not selects(found["-worker"], osc)
    assert selects(found["-oscillator"], osc) and not selects(found["-oscillator"], sts)
    # Two ports, each admitted to its own peers: Prometheus never reaches the admin API.
    metrics, web = port_of(worker, "metrics"), port_of(worker, "http")
    assert metrics != web
    assert admitted(found["-worker"]) == [(metrics, np["scrapeFrom"]), (web, np["adminFrom"])]
    assert admitted(found["-oscillator"]) == [(port_of(oscillator, "http"), np["scrapeFrom"])]
    # The worker serves /metrics alone on the port the policy admits Prometheus to.
    data = rendered.one("ConfigMap", "-worker")["data"]
    assert (int(data["TIMERS_METRICS_PORT"]), int(data["TIMERS_WEB_PORT"])) == (metrics, web)
    # The probes go to the web port, from the kubelet on the node, which Kubernetes always admits.
    assert {worker[p]["httpGet"]["port"] for p in ("livenessProbe", "readinessProbe")} == {"http"}


def test_by_default_the_admin_api_is_admitted_from_nowhere(render: RenderFn) -> None:
    rendered = render({})
    found = policies(rendered)
    assert set(found) == {"", "-worker", "-oscillator"}
    assert admitted(found["-worker"]) == [(6067, [PROMETHEUS])]
    assert admitted(found["-oscillator"]) == [(8090, [PROMETHEUS])]


def test_the_ports_follow_the_values(render: RenderFn) -> None:
    values = {
        "worker": {"port": 7077, "metricsPort": 7078},
        "oscillator": {"port": 9100},
        "networkPolicy": {"adminFrom": [OPS]},
    }
    found = policies(render(values))
    assert admitted(found["-worker"]) == [(7078, [PROMETHEUS]), (7077, [OPS])]
    assert admitted(found["-oscillator"]) == [(9100, [PROMETHEUS])]


def test_with_no_peers_nothing_is_admitted(render: RenderFn) -> None:
    found = policies(render({"networkPolicy": {"scrapeFrom": [], "adminFrom": []}}))
    # Deny all but the node, never an empty rule (which would allow all).
    assert found["-worker"]["spec"]["ingress"] == [] and found["-oscillator"]["spec"]["ingress"] == []
    only_admin = policies(render({"networkPolicy": {"scrapeFrom": [], "adminFrom": [OPS]}}))
    assert admitted(only_admin["-worker"]) == [(6066, [OPS])]


def egress(rendered: Rendered) -> list[dict[str, Any]]:
    policy = policies(rendered)[""]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    rules = list(policy["spec"]["egress"])
    for rule in rules:
        assert rule.get("to") and rule.get("ports"), "a rule without peers or ports lets everything out"
    return rules


def reaches(rules: list[dict[str, Any]], address: str, port: int) -> bool:
    ip = ipaddress.ip_address(address)
    for rule in rules:
        if not any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in rule["ports"]):
            continue
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block is None:
                continue
            inside = ip in ipaddress.ip_network(block["cidr"])
            excepted = any(ip in ipaddress.ip_network(e) for e in block.get("except", []))
            if inside and not excepted:
                return True
    return False


def test_every_pod_of_the_release_reaches_kafka_and_dns_only(render: RenderFn) -> None:
    rendered = render({"kafka": {"bootstrapServers": "b-0.kafka:9093,b-1.kafka:9093,b-2.kafka:9094"}})
    rules = egress(rendered)
    policy = policies(rendered)[""]
    for manifest in rendered.manifests:
        if manifest.kind in {"Deployment", "StatefulSet", "Job", "Pod"}:
            assert selects(policy, manifest.obj), f"{manifest.kind} {manifest.name} is not restricted"
    # The brokers' ports, on any address but the cloud metadata endpoint.
    assert reaches(rules, "10.1.2.3", 9093) and reaches(rules, "10.1.2.3", 9094)
    assert not reaches(rules, str(METADATA), 9093)
    assert not reaches(rules, "10.1.2.3", 443)
    (dns,) = [r for r in rules if {p["port"] for p in r["ports"]} == {53}]
    assert {p["protocol"] for p in dns["ports"]} == {"UDP", "TCP"}
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    # Nothing comes in but what the component policies admit.
    assert policy["spec"]["ingress"] == []


def test_the_operator_names_the_brokers_and_adds_rules(render: RenderFn) -> None:
    rules = egress(render(PRODUCTION))
    np = PRODUCTION["networkPolicy"]
    assert reaches(rules, "10.40.7.1", 9096) and not reaches(rules, "10.41.0.1", 9096)
    # The Schema Registry's port, at the brokers' addresses.
    assert reaches(rules, "10.40.7.1", 8081)
    assert rules[-1] == np["extraEgress"][0]
    compaction = egress(
        render({"networkPolicy": {"kafkaPorts": [9092, 19092]}, "jobs": {"compaction": {"enabled": True}}})
    )
    assert reaches(compaction, "10.1.2.3", 19092)
    # The Spark jobs are restricted like the services.
    rendered = render({"jobs": {"compaction": {"enabled": True}}})
    assert selects(policies(rendered)[""], rendered.one("CronJob", "-compact"))


def test_off_when_disabled(render: RenderFn) -> None:
    rendered = render({"networkPolicy": {"enabled": False}})
    assert rendered.of_kind("NetworkPolicy") == []
    assert "WARNING: networkPolicy.enabled is false" in rendered.notes
