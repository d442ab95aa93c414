"""What a platform team relies on: redundancy, durable worker state, safe secrets, restarts on change."""

from __future__ import annotations

import base64
from pathlib import PurePosixPath
from typing import Any

import helm_python
import pytest

from futures.jobs.compact import default_out
from tests.helm.conftest import CHART_DIR, COMPACTION, INLINE_SASL, PRODUCTION, RenderFn, containers, pod_spec
from tests.helm.test_contract import container_env


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_oscillators_are_redundant_spread_and_protected(render: RenderFn) -> None:
    rendered = render({})
    osc = rendered.one("Deployment", "-oscillator")
    labels = osc["spec"]["template"]["metadata"]["labels"]
    assert osc["spec"]["replicas"] >= 2
    # A rollout adds a ticking oscillator before it removes one.
    assert osc["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    terms = pod_spec(osc)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["labelSelector"], labels)
    pdb = rendered.one("PodDisruptionBudget", "-oscillator")
    assert _selects(pdb["spec"]["selector"], labels)
    assert pdb["spec"]["maxUnavailable"] < osc["spec"]["replicas"]
    # Alive while its loop turns; ready while its ticks are acknowledged: a broker outage is no restart.
    probes = containers(osc)[0]
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_hard_anti_affinity_and_zone_spread_are_rules(render: RenderFn) -> None:
    osc = render(PRODUCTION).one("Deployment", "-oscillator")
    spec = pod_spec(osc)
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["affinity"]["podAntiAffinity"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"


def test_worker_keeps_rocksdb_on_its_own_volume(render: RenderFn) -> None:
    rendered = render({})
    sts = rendered.one("StatefulSet", "-worker")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    (worker,) = containers(sts)
    data_dir = rendered.one("ConfigMap", "-worker")["data"]["TIMERS_DATA_DIR"]
    mount = next(m for m in worker["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert data_dir.startswith(mount["mountPath"].rstrip("/") + "/")
    # SIGTERM flushes and commits; the kubelet must wait for it.
    assert pod_spec(sts)["terminationGracePeriodSeconds"] >= 30
    headless = rendered.one("Service", "-worker")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    pdb = rendered.one("PodDisruptionBudget", "-worker")
    assert _selects(pdb["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert worker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert worker["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_a_workers_volume_goes_with_its_pod_unless_told_to_stay(render: RenderFn) -> None:
    # A cache of the changelog: a table on a volume a scale-in left behind would be rebuilt anyway
    # once it has aged past the changelog's delete.retention.ms.
    sts = render({}).one("StatefulSet", "-worker")
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenScaled": "Delete",
        "whenDeleted": "Delete",
    }
    kept = {"worker": {"persistence": {"retentionPolicy": {"whenScaled": "Retain", "whenDeleted": "Retain"}}}}
    sts = render(kept).one("StatefulSet", "-worker")
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenScaled": "Retain",
        "whenDeleted": "Retain",
    }


def test_probes_and_metrics_use_the_ports_the_services_listen_on(render: RenderFn) -> None:
    rendered = render({"oscillator": {"port": 9100}, "worker": {"port": 7070, "metricsPort": 7071}})
    for kind, suffix, probe_key, metrics_key in (
        ("Deployment", "-oscillator", "TIMERS_OSC_HEALTH_PORT", "TIMERS_OSC_HEALTH_PORT"),
        ("StatefulSet", "-worker", "TIMERS_WEB_PORT", "TIMERS_METRICS_PORT"),
    ):
        workload = rendered.one(kind, suffix)
        data = rendered.one("ConfigMap", suffix)["data"]
        (container,) = containers(workload)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # The probes' port is the one the component serves /healthz on.
        assert ports[container["livenessProbe"]["httpGet"]["port"]] == int(data[probe_key])
        # Scrapers find the metrics where they are served: by annotation, and by the Service port
        # named "metrics" that a ServiceMonitor selects.
        metrics = int(data[metrics_key])
        assert workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(metrics)
        service_ports = {p["name"]: p for p in rendered.one("Service", suffix)["spec"]["ports"]}
        assert ports[service_ports["metrics"]["targetPort"]] == metrics


def test_no_secret_value_outside_secrets(render: RenderFn) -> None:
    password = INLINE_SASL["kafka"]["sasl"]["password"]
    rendered = render(COMPACTION)  # inline SASL credentials, and every optional workload
    for m in rendered.manifests:
        if m.kind == "Secret":
            assert base64.b64decode(m.obj["data"]["password"]).decode() == password
            continue
        assert password not in str(m.obj), f"{m.kind} {m.name} holds the password"
    secrets = {m.name for m in rendered.of_kind("Secret")}
    # Every container that talks to Kafka reads the credentials from files of a mounted Secret of
    # the chart's, and none has them in its environment.
    read_from = []
    for m in rendered.manifests:
        if m.kind in {"Deployment", "StatefulSet", "Job", "CronJob", "Pod"}:
            for c in containers(m.obj):
                env = container_env(rendered, c)
                assert not {"KAFKA_SASL_PASSWORD", "KAFKA_SASL_USERNAME"} & set(env), m.name
                for variable in ("KAFKA_SASL_PASSWORD_FILE", "KAFKA_SASL_USERNAME_FILE"):
                    secret, key = mounted_secret(m.obj, c, rendered_path(rendered, c, variable))
                    assert key == variable.split("_")[2].lower(), (m.name, variable)
                    read_from.append(secret)
    assert read_from and set(read_from) <= secrets


def rendered_path(rendered: Any, container: dict[str, Any], variable: str) -> str:
    """The path a ``*_FILE`` variable names in the pod (before the tests stub the file)."""
    data: dict[str, str] = {}
    for source in container.get("envFrom", []):
        data.update(rendered.one("ConfigMap", source["configMapRef"]["name"])["data"])
    data.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
    return data[variable]


def mounted_secret(workload: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret, key) of the file at ``path`` in the container: it must be a Secret's item."""
    directory, _, file = path.rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    # Readable by the pod's group (fsGroup), nobody else.
    assert secret["defaultMode"] == 0o440
    (key,) = [item["key"] for item in secret["items"] if item["path"] == file]
    return str(secret["secretName"]), str(key)


def test_existing_secret_is_used_as_is(render: RenderFn) -> None:
    rendered = render(PRODUCTION)
    assert rendered.of_kind("Secret") == []
    sts = rendered.one("StatefulSet", "-worker")
    (worker,) = containers(sts)
    assert not [e for e in worker["env"] if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]]
    files = {
        variable: mounted_secret(sts, worker, rendered_path(rendered, worker, variable))
        for variable in (
            "KAFKA_SASL_USERNAME_FILE",
            "KAFKA_SASL_PASSWORD_FILE",
            "TIMERS_ADMIN_TOKEN_FILE",
            "TIMERS_ADMIN_READ_TOKEN_FILE",
            "TIMERS_SCHEMA_REGISTRY_BASIC_AUTH_FILE",
        )
    }
    assert files == {
        "KAFKA_SASL_USERNAME_FILE": ("kafka-timers-credentials", "username"),
        "KAFKA_SASL_PASSWORD_FILE": ("kafka-timers-credentials", "password"),
        "TIMERS_ADMIN_TOKEN_FILE": ("kafka-timers-admin", "token"),
        "TIMERS_ADMIN_READ_TOKEN_FILE": ("kafka-timers-admin", "readToken"),
        "TIMERS_SCHEMA_REGISTRY_BASIC_AUTH_FILE": ("registry-auth", "userInfo"),
    }
    common = rendered.one("ConfigMap", "-common")["data"]
    assert common["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert common["KAFKA_SSL_CA_LOCATION"] == "/etc/kafka-timers/tls/ca.pem"


def _checksums(rendered: Any) -> dict[str, dict[str, str]]:
    out = {}
    for kind, suffix in (("Deployment", "-oscillator"), ("StatefulSet", "-worker")):
        annotations = rendered.one(kind, suffix)["spec"]["template"]["metadata"]["annotations"]
        out[suffix] = {k: v for k, v in annotations.items() if k.startswith("checksum/")}
    return out


def test_pods_restart_when_their_config_or_secret_changes(render: RenderFn) -> None:
    base = _checksums(render(INLINE_SASL))
    worker_change = _checksums(render({**INLINE_SASL, "worker": {"latePolicy": "drop"}}))
    assert worker_change["-worker"]["checksum/config"] != base["-worker"]["checksum/config"]
    # Only the pods whose config changed roll.
    assert worker_change["-oscillator"] == base["-oscillator"]
    common_change = _checksums(render({**INLINE_SASL, "logLevel": "debug"}))
    assert all(common_change[c]["checksum/config"] != base[c]["checksum/config"] for c in base)
    rotated = {"kafka": {"sasl": {**INLINE_SASL["kafka"]["sasl"], "password": "rotated"}}}
    secret_change = _checksums(render(rotated))
    assert all(secret_change[c]["checksum/secret"] != base[c]["checksum/secret"] for c in base)


def test_topic_job_runs_before_install_and_upgrade(render: RenderFn) -> None:
    rendered = render(INLINE_SASL)
    job = rendered.one("Job", "-topics")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    (c,) = containers(job)
    assert c["command"] == ["timers", "topics", "create", "--partitions", "12"]
    # Hooks run before the release's ConfigMaps exist: the settings are inline...
    env = {e["name"]: e for e in c["env"]}
    assert env["KAFKA_BOOTSTRAP_SERVERS"]["value"] == "kafka:9092"
    assert "envFrom" not in c
    # ...and the credentials come from a hook Secret created just before the Job.
    secret_name, _ = mounted_secret(job, c, env["KAFKA_SASL_PASSWORD_FILE"]["value"])
    hook_secret = rendered.one("Secret", secret_name)
    assert hook_secret["metadata"]["annotations"]["helm.sh/hook"] == annotations["helm.sh/hook"]
    assert int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        annotations["helm.sh/hook-weight"]
    )
    (check,) = containers(render({"topics": {"create": False}}).one("Job", "-topics"))
    assert check["command"] == ["timers", "topics", "check"]


def test_scrape_annotations_give_way_to_the_service_monitor(render: RenderFn) -> None:
    default = render({}).one("StatefulSet", "-worker")["spec"]["template"]["metadata"]["annotations"]
    assert default["prometheus.io/scrape"] == "true"
    production = render(PRODUCTION)
    annotations = production.one("StatefulSet", "-worker")["spec"]["template"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations
    monitor = production.one("ServiceMonitor", "")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The port named "metrics" of both Services: the workers' is not their admin API's port.
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    for suffix in ("-worker", "-oscillator"):
        assert "metrics" in {p["name"] for p in production.one("Service", suffix)["spec"]["ports"]}


def test_spark_jobs_run_the_jobs_image_with_the_master_from_values(render: RenderFn) -> None:
    rendered = render(COMPACTION)
    (compact,) = containers(rendered.one("CronJob", "-compact"))
    assert compact["image"] == "kafka-timers:0.1.0-jobs"
    assert compact["command"] == ["timers-compact"]
    assert compact["args"] == ["--master", "local[4]", "--publish"]
    (replay,) = containers(next(m.obj for m in rendered.of_kind("Job") if "-replay-" in m.name))
    assert replay["command"] == ["timers-replay"]
    assert replay["args"][:2] == ["--master", "local[4]"]
    # The jobs' default snapshot path, relative to the working directory, is on the snapshot volume.
    for job in (compact, replay):
        mounts = {m["name"]: m["mountPath"] for m in job["volumeMounts"]}
        default = PurePosixPath(job["workingDir"]) / default_out()
        assert default.is_relative_to(mounts["snapshots"]), (default, mounts)


def test_notes_warn_about_idle_workers_and_a_lone_oscillator(render: RenderFn) -> None:
    assert "WARNING" not in render({}).notes
    notes = render({"worker": {"replicas": 16}, "oscillator": {"replicas": 1}}).notes
    assert "16 workers for 12 partitions" in notes
    assert "4 worker(s) stay idle" in notes
    assert "a single oscillator" in notes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka": {"sasl": {"enabled": True}}}, "kafka.sasl.existingSecret"),
        ({"tests": {"callbackTopic": "timers-probe"}}, 'starts with "timers-"'),
        ({"worker": {"port": 7000, "metricsPort": 7000}}, "a port of their own"),
    ],
)
def test_impossible_settings_fail_with_the_fix(
    render: RenderFn, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)


def test_test_topic_joins_a_non_empty_allow_list(render: RenderFn) -> None:
    data = render(PRODUCTION).one("ConfigMap", "-worker")["data"]
    assert data["TIMERS_ALLOWED_CALLBACK_TOPICS"] == "orders-*,reminders,kafka-timers-helm-test"
    assert render({}).one("ConfigMap", "-worker")["data"]["TIMERS_ALLOWED_CALLBACK_TOPICS"] == ""


def test_tmp_is_bounded_and_larger_for_spark(render: RenderFn) -> None:
    """/tmp is the one writable place besides the volumes: a runaway writer is evicted, no node filled."""
    rendered = render({**COMPACTION, "tmpSizeLimit": "300Mi"})
    limits = {}
    for m in rendered.manifests:
        if m.kind in {"Deployment", "StatefulSet", "Job", "CronJob", "Pod"}:
            (tmp,) = [v for v in pod_spec(m.obj)["volumes"] if v["name"] == "tmp"]
            limits[m.name.rsplit("-", 2)[0] if "-replay-" in m.name else m.name] = tmp["emptyDir"][
                "sizeLimit"
            ]
    spark = {name for name in limits if name.endswith(("-compact", "-replay"))}
    assert spark == {"timers-kafka-timers-compact", "timers-kafka-timers-replay"}
    assert {limits[name] for name in spark} == {COMPACTION["jobs"]["tmpSizeLimit"]}
    assert {limit for name, limit in limits.items() if name not in spark} == {"300Mi"}


#: The long-running workloads, whose containers read their Secrets once, at start.
SERVICES = (("Deployment", "-oscillator"), ("StatefulSet", "-worker"))


def test_bumping_a_pod_annotation_rolls_the_oscillators_and_the_workers(render: RenderFn) -> None:
    """The remedy the chart README gives for a rotated Secret of the operator's own: the chart
    cannot read it, so no checksum changes; a pod annotation the operator bumps does."""

    def annotations(stamp: str) -> dict[str, dict[str, str]]:
        rendered = render({"podAnnotations": {"kafka-timers/secrets-rotated": stamp}})
        return {s: rendered.one(k, s)["spec"]["template"]["metadata"]["annotations"] for k, s in SERVICES}

    before, after = annotations("2026-01-01"), annotations("2026-02-01")
    for _, suffix in SERVICES:
        assert before[suffix]["kafka-timers/secrets-rotated"] == "2026-01-01"
        assert after[suffix]["kafka-timers/secrets-rotated"] == "2026-02-01"


def test_workload_annotations_are_on_the_workloads_not_on_their_pods(render: RenderFn) -> None:
    """Stakater Reloader reads its annotations on the Deployment or StatefulSet itself."""
    reloader = {"reloader.stakater.com/auto": "true"}
    rendered = render({"workloadAnnotations": reloader})
    for kind, suffix in SERVICES:
        workload = rendered.one(kind, suffix)
        assert workload["metadata"]["annotations"] == reloader
        assert "reloader.stakater.com/auto" not in workload["spec"]["template"]["metadata"]["annotations"]
    assert all("annotations" not in render({}).one(k, s)["metadata"] for k, s in SERVICES)


def _upgrade_note(title: str) -> str:
    """The bullet of the chart README's upgrade notes whose bold title starts with ``title``."""
    text = (CHART_DIR / "README.md").read_text()
    section = text.split("\n## Upgrading\n", 1)[1].split("\n## ", 1)[0]
    (note,) = [b for b in section.split("\n- ") if b.startswith(f"**{title}")]
    return " ".join(note.split())


#: A change of each value that feeds a field of the workers' StatefulSet Kubernetes never updates.
IMMUTABLE_CHANGES = {
    "worker.persistence.size": {"worker": {"persistence": {"size": "20Gi"}}},
    "worker.persistence.storageClassName": {"worker": {"persistence": {"storageClassName": "fast"}}},
    "worker.persistence.accessModes": {"worker": {"persistence": {"accessModes": ["ReadWriteOncePod"]}}},
    "worker.persistence.annotations": {"worker": {"persistence": {"annotations": {"backup": "no"}}}},
    "worker.podManagementPolicy": {"worker": {"podManagementPolicy": "OrderedReady"}},
}
IMMUTABLE_FIELDS = ("volumeClaimTemplates", "serviceName", "selector", "podManagementPolicy")


def _immutable(rendered: Any) -> tuple[str, dict[str, Any]]:
    workers = rendered.one("StatefulSet", "-worker")
    return workers["metadata"]["name"], {f: workers["spec"][f] for f in IMMUTABLE_FIELDS}


@pytest.mark.parametrize("value", sorted(IMMUTABLE_CHANGES))
def test_the_upgrade_notes_name_each_value_an_upgrade_cannot_change_in_place(
    render: RenderFn, value: str
) -> None:
    name, fields = _immutable(render({}))
    changed_name, changed = _immutable(render(IMMUTABLE_CHANGES[value]))
    assert changed_name == name and changed != fields
    note = _upgrade_note("Some StatefulSet fields cannot change")
    assert f"`{value}`" in note or f"`.{value.rsplit('.', 1)[1]}`" in note
    assert "--cascade=orphan" in note
    assert all(f"`{field}`" in note for field in changed if changed[field] != fields[field])


@pytest.mark.parametrize("value", ["nameOverride", "fullnameOverride"])
def test_the_upgrade_notes_say_a_new_name_replaces_the_workloads(render: RenderFn, value: str) -> None:
    """Their StatefulSet gets a new name, so new volumes: not the in-place change the orphan
    remedy is for."""
    name, _ = _immutable(render({}))
    renamed, _ = _immutable(render({value: "ktimers"}))
    assert renamed != name
    note = _upgrade_note("Keep `nameOverride` and `fullnameOverride`")
    assert "empty volumes" in note and "`serviceName`" in note and "`selector`" in note
