"""The PrometheusRule's alerts, run by Prometheus' own rule engine (promtool) on synthetic series.

Each scenario is a failure users must hear about, played minute by minute: the alert must stay
quiet while things are fine and fire once the condition held for its ``for``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.conftest import NAMESPACE, RELEASE, RenderFn

PROMTOOL = shutil.which("promtool")
SELECT = f'namespace="{NAMESPACE}"'
OSC = f'timers_oscillator_last_second_delivered{{{SELECT},pod="{RELEASE}-kafka-timers-oscillator-%s"}}'
WORKER = f'{{{SELECT},pod="{RELEASE}-kafka-timers-worker-0"'

pytestmark = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool is not installed: `make promtool` (Debian package prometheus)",
)


def _series(name: str, values: str) -> dict[str, str]:
    return {"series": name, "values": values}


def _alert(alertname: str, eval_time: str, *expected: tuple[dict[str, str], str, str]) -> dict[str, Any]:
    """What ``alertname`` shows at ``eval_time``: (labels, summary, description) per alert; none: silent."""
    return {
        "alertname": alertname,
        "eval_time": eval_time,
        "exp_alerts": [
            {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}
            for labels, summary, description in expected
        ],
    }


FULLNAME = f"{NAMESPACE}/{RELEASE}-kafka-timers"
NOT_TICKING = (
    "No oscillator is ticking; no timer fires.",
    f"No oscillator of {FULLNAME} had a tick acknowledged by Kafka for more than 30s. "
    "Check the oscillator pods' logs and their connection to Kafka.",
)


# Series values are one sample a minute; "0+60x10" counts epoch seconds for 10 minutes.
SCENARIOS: list[dict[str, Any]] = [
    {
        "name": "one of two oscillators stops: redundancy lost, time goes on",
        "input_series": [
            _series(OSC % "a", "0+60x30"),
            _series(OSC % "b", "0+60x5 300x25"),
        ],
        "alert_rule_test": [
            _alert("KafkaTimersOscillatorRedundancyLost", "4m"),
            _alert(
                "KafkaTimersOscillatorRedundancyLost",
                "20m",
                (
                    {"severity": "warning"},
                    "Fewer than 2 oscillators are ticking.",
                    f"1 oscillator(s) of {FULLNAME} are ticking, fewer than 2: "
                    "one more failure stops every timer.",
                ),
            ),
            _alert("KafkaTimersOscillatorNotTicking", "20m"),
        ],
    },
    {
        "name": "every oscillator stops: time stands still",
        "input_series": [
            _series(OSC % "a", "0+60x5 300x10"),
            _series(OSC % "b", "0+60x5 290x10"),
        ],
        "alert_rule_test": [
            _alert("KafkaTimersOscillatorNotTicking", "5m"),
            _alert("KafkaTimersOscillatorNotTicking", "8m", ({"severity": "critical"}, *NOT_TICKING)),
        ],
    },
    {
        "name": "no oscillator is scraped at all",
        "input_series": [_series(f'timers_watermark_seconds{WORKER},partition="0"}}', "0+60x10")],
        "alert_rule_test": [
            _alert(
                "KafkaTimersOscillatorNotTicking",
                "5m",
                ({"severity": "critical", "namespace": NAMESPACE}, *NOT_TICKING),
            ),
        ],
    },
    {
        "name": "one partition's clock stalls while the others move",
        "input_series": [
            _series(f'timers_watermark_seconds{WORKER},partition="0"}}', "0+60x10 600x20"),
            _series(f'timers_watermark_seconds{WORKER},partition="1"}}', "0+60x30"),
        ],
        "alert_rule_test": [
            _alert("KafkaTimersWatermarkLagging", "12m"),
            _alert(
                "KafkaTimersWatermarkLagging",
                "20m",
                (
                    {"severity": "critical", "partition": "0"},
                    "Timers of partition 0 are not firing on time.",
                    "The clock of partition 0 is 10m 0s behind (alert above 60s): its timers due since then "
                    "have not fired. Check the oscillators, then the worker that holds the partition "
                    "(its log, CPU and /readyz).",
                ),
            ),
        ],
    },
    {
        "name": "timers start firing 5-10 s late",
        "input_series": [
            # 100 callbacks a minute within 1 s; from minute 10, 1,000 more a minute between 5 and 10 s late.
            _series(f'timers_fire_lateness_seconds_bucket{WORKER},le="1"}}', "0+100x40"),
            _series(f'timers_fire_lateness_seconds_bucket{WORKER},le="5"}}', "0+100x40"),
            _series(f'timers_fire_lateness_seconds_bucket{WORKER},le="10"}}', "0+100x10 1000+1100x30"),
            _series(f'timers_fire_lateness_seconds_bucket{WORKER},le="+Inf"}}', "0+100x10 1000+1100x30"),
        ],
        "alert_rule_test": [
            _alert("KafkaTimersFireLatenessHigh", "9m"),
            _alert(
                "KafkaTimersFireLatenessHigh",
                "30m",
                (
                    {"severity": "warning"},
                    "Timers fire late (p99 above 5s).",
                    "The 99th percentile of fire lateness over 10m is 9.945s. Usual causes: a worker short "
                    "of CPU, a slow callback topic, or a burst of timers due in the same second.",
                ),
            ),
        ],
    },
    {
        "name": "a burst of bad requests is dead-lettered",
        "input_series": [
            _series(f'timers_rejected_total{WORKER},reason="bad-due-time"}}', "0 0 0 5 10x9"),
            _series(f'timers_rejected_total{WORKER},reason="payload-too-large"}}', "0x12"),
        ],
        "alert_rule_test": [
            _alert("KafkaTimersDeadLetters", "2m"),
            _alert(
                "KafkaTimersDeadLetters",
                "4m",
                (
                    {"severity": "warning", "reason": "bad-due-time"},
                    "Timer requests are rejected: bad-due-time.",
                    "Requests or callbacks with reason bad-due-time are dead-lettered to timer-request-dlq "
                    "(or dropped by the late policy). The records there carry kt-reason and kt-error "
                    "headers that say what to fix.",
                ),
            ),
            _alert("KafkaTimersDeadLetters", "12m"),
        ],
    },
]


@pytest.fixture
def rule_file(render: RenderFn, tmp_path: Path) -> Path:
    rendered = render({"metrics": {"prometheusRule": {"enabled": True}}})
    rule = rendered.one("PrometheusRule", "")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool is missing: run `make promtool`"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, check=False, timeout=60)


def test_rules_are_valid_promql(rule_file: Path) -> None:
    result = _promtool("check", "rules", str(rule_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 rules found" in result.stdout


def test_alerts_fire_exactly_when_they_should(rule_file: Path, tmp_path: Path) -> None:
    tests = []
    for scenario in SCENARIOS:
        tests.append({"interval": "1m", **{k: v for k, v in scenario.items() if k != "name"}})
    spec = tmp_path / "alerts_test.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [rule_file.name], "evaluation_interval": "1m", "tests": tests})
    )
    result = _promtool("test", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
