"""The environment the chart gives each container: read by that component, defaults as in the code.

Every default is written once, in the component's config class. The chart's values must not
quietly restate (or contradict) one: a variable the chart sets either yields the code's default,
or is listed here with the reason the chart differs. And every variable it sets must be read
by the component it is set for, so that a value never outlives the setting it fed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from futures.worker.config import WORKER_ENV, WorkerConfig
from oscillator.config import OSCILLATOR_ENV, OscillatorConfig
from tests.helm.conftest import VALUE_SETS, RenderFn, containers
from tests.helm.test_contract import WORKLOAD_KINDS, container_env
from tests.test_console_scripts import SCRIPTS, Recording

#: Variables the chart sets to something else than the code's default, and why.
CHART_CHOICES = {
    "TIMERS_DATA_DIR": "the worker's PersistentVolume",
    "TIMERS_WEB_HOST": "probes and scrapes come from outside the pod",
    "TIMERS_METRICS_PORT": "metrics on a port of their own, admitted apart from the admin API",
    "TIMERS_ADVERTISED_URL": "the pod's DNS name, for the admin API's map of partitions",
    "TIMERS_OSC_HEALTH_HOST": "probes and scrapes come from outside the pod",
    "TIMERS_INSTANCE_ID": "static membership from the pod name",
    "TIMERS_OSC_INSTANCE": "the pod name",
}


#: Variables the chart sets for the runtime under our code, not for it.
FOR_THE_RUNTIME = {
    "HOME": "Spark and the JVM write scratch files under it (the root filesystem is read-only)",
}


def _differs(from_env: Callable[[Mapping[str, str]], Any], name: str, value: str) -> bool:
    return bool(from_env({name: value}) != from_env({}))


@pytest.mark.parametrize(
    ("kind", "name_suffix", "variables", "from_env"),
    [
        ("StatefulSet", "-worker", WORKER_ENV, WorkerConfig.from_env),
        ("Deployment", "-oscillator", OSCILLATOR_ENV, OscillatorConfig.from_env),
    ],
)
def test_the_chart_defaults_are_the_code_defaults(
    render: RenderFn,
    kind: str,
    name_suffix: str,
    variables: tuple[Any, ...],
    from_env: Callable[[Mapping[str, str]], Any],
) -> None:
    rendered = render(VALUE_SETS["default"])
    (container,) = containers(rendered.one(kind, name_suffix))
    env = container_env(rendered, container)
    names = {var.name for var in variables}
    differing = {name for name, value in env.items() if name in names and _differs(from_env, name, value)}
    assert differing == set(CHART_CHOICES) & names & set(env)


def test_a_chart_value_that_contradicts_the_code_is_caught(render: RenderFn) -> None:
    rendered = render({"worker": {"fireChunkSize": 1000}})
    (container,) = containers(rendered.one("StatefulSet", "-worker"))
    assert _differs(
        WorkerConfig.from_env,
        "TIMERS_FIRE_CHUNK_SIZE",
        container_env(rendered, container)["TIMERS_FIRE_CHUNK_SIZE"],
    )


def _reads(command: str) -> set[str]:
    """The variables the component started as ``command`` reads (from_env, then its entry point)."""
    component = SCRIPTS[command]
    recording = Recording()
    component.from_env(recording)
    return recording.read | component.read_by_main


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_variable_the_chart_sets_is_read_where_it_is_set(render: RenderFn, value_set: str) -> None:
    values = VALUE_SETS[value_set]
    rendered = render(values)
    # extraEnv is the user's, for whatever runs in the pod: not the chart's to check.
    extra_env = {
        item["name"] for part in ("worker", "oscillator") for item in values.get(part, {}).get("extraEnv", [])
    }
    unread: dict[str, set[str]] = {}
    for manifest in rendered.manifests:
        if manifest.kind not in WORKLOAD_KINDS:
            continue
        for container in containers(manifest.obj):
            command = container["command"][0]
            # The helm test pod runs the chart's script, which reads what `timers` reads.
            command = "timers" if command == "python" else command
            env = container_env(rendered, container)
            extra = set(env) - _reads(command) - set(FOR_THE_RUNTIME) - extra_env
            if extra:
                unread[f"{manifest.kind}/{manifest.name} ({command})"] = extra
    assert unread == {}
