"""Scaling out on Kafka partitions: several workers share them, and take over when one leaves."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter

import pytest

from ktimers.broker import free_port
from tests.integration.conftest import WORKER_READY, Stack
from tests.integration.test_firing import assert_fired_once_never_early, schedule_spread
from tests.processes import Service

pytestmark = pytest.mark.integration


def readiness(port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:  # noqa: S310
            return dict(json.loads(response.read()))
    except OSError:
        return {"status": "unreachable"}


def wait_until_partitions_split(ports: list[int], partitions: int, timeout_s: float) -> list[list[int]]:
    """Wait until every worker is ready and together they hold each partition exactly once."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = [readiness(p) for p in ports]
        held = [list(s.get("partitions", [])) for s in states]  # type: ignore[call-overload]
        if all(s.get("status") == "ready" for s in states) and sorted(sum(held, [])) == list(
            range(partitions)
        ):
            return held
        if time.monotonic() > deadline:
            raise AssertionError(f"partitions never split cleanly: {states}")
        time.sleep(0.3)


def start_second_worker(stack: Stack) -> tuple[Service, int]:
    """A second worker of ``stack``'s instance, with its own data dir, started: it and its web port."""
    port = free_port()
    env = {
        **stack.worker_env(),
        "TIMERS_DATA_DIR": str(stack.data_dir.parent / "second-worker"),
        "TIMERS_WEB_PORT": str(port),
    }
    second = stack.spawn("worker-b", ["-m", "futures.worker.main"], env)
    second.wait_for_output(WORKER_READY, timeout_s=60)
    return second, port


def survivor_state(stack: Stack) -> dict[str, float]:
    """What to look at when a takeover failed: pending timers, clocks, ticks, requests."""
    wanted = (
        "timers_pending",
        "timers_watermark",
        "timers_ticks_total",
        "timers_requests",
        "timers_scheduled",
    )
    return {k: v for k, v in stack.metrics().items() if k.startswith(wanted)}


def test_two_workers_share_the_partitions_and_one_takes_over(running: Stack) -> None:
    second, second_port = start_second_worker(running)
    held = wait_until_partitions_split([running.web_port, second_port], 4, timeout_s=60)
    assert all(held), f"one worker holds nothing: {held}"

    reader = running.callback_topic("scale")
    due = schedule_spread(running, reader.topic, 1000, start_s=1.0, span_s=4.0)
    reader.read_until(lambda r: len(r) >= 1000, timeout_s=40)
    reader.poll(1.0)
    assert_fired_once_never_early(reader.records, due)

    # One worker leaves; the other takes its partitions over (rebuilding them
    # from the changelog) and fires what the leaver held.
    later = schedule_spread(running, reader.topic, 400, start_s=3.0, span_s=3.0)
    stopped_at = time.monotonic()
    assert second.stop() == 0
    wait_until_partitions_split([running.web_port], 4, timeout_s=60)
    took_over_s = time.monotonic() - stopped_at
    reader.read_until(lambda r: len(r) >= 1400, timeout_s=60)
    reader.poll(1.0)
    print(f"\ntakeover {took_over_s:.1f}s, all fired {time.monotonic() - stopped_at:.1f}s after the stop")
    counts = Counter(c.timer_id for c in reader.records)
    missing = (set(due) | set(later)) - set(counts)
    assert not missing, (
        f"{len(missing)} never fired ({len(missing & set(later))} of the 400 scheduled before the stop); "
        f"survivor's state: {survivor_state(running)}"
    )
    assert max(counts.values()) == 1
    assert all(c.received_ms >= {**due, **later}[c.timer_id] for c in reader.records)
