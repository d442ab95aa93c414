"""`helm test`'s pod, run for real: the chart's script and arguments against a running service.

The pod's command line and environment come from the rendered chart; only the Kafka address and
topic names are swapped for the embedded broker's, as the release's ConfigMap would set them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helm.conftest import CHART_DIR, RenderFn, containers
from tests.helm.test_contract import container_env
from tests.integration.conftest import Stack
from tests.processes import SpawnFn

pytestmark = pytest.mark.integration

SCRIPT = CHART_DIR / "files" / "helm_test.py"


def _pod_command(render: RenderFn, topic: str) -> tuple[list[str], dict[str, str]]:
    rendered = render({"tests": {"callbackTopic": topic, "delaySeconds": 2, "timeoutSeconds": 30}})
    pod = rendered.one("Pod", "-test")
    (container,) = containers(pod)
    command = container["command"]
    # The pod mounts the script from a ConfigMap that holds exactly the chart's file.
    mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["test-script"]
    assert command[:2] == ["python", f"{mounted}/{SCRIPT.name}"]
    assert rendered.one("ConfigMap", "-test")["data"][SCRIPT.name].rstrip() == SCRIPT.read_text().rstrip()
    return [sys.executable, str(SCRIPT), *command[2:]], container_env(rendered, container)


def _run(command: list[str], env: dict[str, str], *extra: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [*command, *extra], env=env, capture_output=True, text=True, timeout=90, check=False, cwd=Path.cwd()
    )
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr
    return result.returncode, json.loads(lines[-1])


def test_helm_test_pod_schedules_a_timer_and_sees_it_fire(
    render: RenderFn,
    timers_env: dict[str, str],
    spawn: SpawnFn,
    tmp_path: Path,
    unique: Callable[[str], str],
) -> None:
    command, pod_env = _pod_command(render, unique("helm-test"))
    stack = Stack(env=timers_env, spawn=spawn, data_dir=tmp_path / "worker-data")
    # The release's ConfigMap, pointed at the test broker and this test's topics.
    env = {**pod_env, **{k: v for k, v in timers_env.items() if k.startswith(("KAFKA_", "TIMERS_TOPIC_"))}}
    stack.start_worker()

    # No oscillator yet: time stands still, and the test must say so instead of passing.
    status, report = _run(command, env, "--timeout", "4")
    assert (status, report["result"]) == (1, "no callback"), report
    assert "oscillator" in report["error"]

    stack.start_oscillator()
    status, report = _run(command, env)
    assert (status, report["result"]) == (0, "ok"), report
    assert report["due_header_matches"] is True
    # Fired on the first tick at or after the due time: never early, about a second late at most.
    assert 0 <= report["fired_minus_due_ms"] < 3000
