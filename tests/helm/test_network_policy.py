"""The workers' NetworkPolicy: on by default, their one port only, from exactly the peers named in values."""

from __future__ import annotations

from typing import Any

from tests.helm.conftest import PRODUCTION, RenderFn, containers

PROMETHEUS = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
OPS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
    "podSelector": {"matchLabels": {"app": "timers-admin"}},
}


def policy_of(values: dict[str, Any], render: RenderFn) -> dict[str, Any] | None:
    found = render(values).of_kind("NetworkPolicy")
    assert len(found) <= 1
    return found[0].obj if found else None


def admitted(policy: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """(port, peers) of every ingress rule; every rule must name its port and its peers."""
    rules = []
    for rule in policy["spec"].get("ingress", []):
        assert rule.get("from"), "a rule without peers admits every source"
        (port,) = [p["port"] for p in rule["ports"]]
        rules.append((port, rule["from"]))
    return rules


def test_on_by_default_it_admits_prometheus_to_the_worker_port_only(render: RenderFn) -> None:
    rendered = render({})
    policy = rendered.one("NetworkPolicy", "-worker")
    sts = rendered.one("StatefulSet", "-worker")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items() and selector["app.kubernetes.io/component"] == "worker"
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # Kafka stays reachable
    (worker,) = containers(sts)
    port = worker["ports"][0]["containerPort"]
    assert admitted(policy) == [(port, [PROMETHEUS])]
    # The probes go to that port, from the kubelet on the node, which Kubernetes always admits.
    assert {worker[p]["httpGet"]["port"] for p in ("livenessProbe", "readinessProbe")} == {"http"}
    # The oscillators have no admin API: the policy leaves them alone.
    osc_labels = rendered.one("Deployment", "-oscillator")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= osc_labels.items()


def test_admin_peers_are_admitted_as_named(render: RenderFn) -> None:
    policy = policy_of(PRODUCTION, render)
    assert policy is not None
    np = PRODUCTION["worker"]["networkPolicy"]
    assert admitted(policy) == [(6066, np["scrapeFrom"]), (6066, np["adminFrom"])]


def test_the_port_follows_worker_port(render: RenderFn) -> None:
    policy = policy_of({"worker": {"port": 7077, "networkPolicy": {"adminFrom": [OPS]}}}, render)
    assert policy is not None
    assert admitted(policy) == [(7077, [PROMETHEUS]), (7077, [OPS])]


def test_with_no_peers_nothing_is_admitted(render: RenderFn) -> None:
    policy = policy_of({"worker": {"networkPolicy": {"scrapeFrom": [], "adminFrom": []}}}, render)
    assert policy is not None
    assert policy["spec"]["ingress"] == []  # deny all but the node, never an empty rule (allow all)
    only_admin = policy_of({"worker": {"networkPolicy": {"scrapeFrom": [], "adminFrom": [OPS]}}}, render)
    assert only_admin is not None and admitted(only_admin) == [(6066, [OPS])]


def test_off_when_disabled(render: RenderFn) -> None:
    assert policy_of({"worker": {"networkPolicy": {"enabled": False}}}, render) is None
