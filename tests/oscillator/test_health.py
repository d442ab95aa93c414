"""/healthz follows the loop (alive), /readyz deliveries (not produce calls); /metrics serves the
oscillator's own registry."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from oscillator.health import HealthServer, Liveness, Readiness
from oscillator.metrics import OscillatorMetrics
from tests.oscillator.fakes import FakeClock


def test_not_ready_before_the_first_delivery_saying_what_it_waits_for() -> None:
    clock = FakeClock(100.0)
    readiness = Readiness(stale_after_s=5.0, clock=clock)
    assert readiness.check() == (False, "no tick delivered yet")

    readiness.waiting("cannot reach Kafka at b1:9092")
    clock.advance(60.0)

    assert readiness.check() == (False, "cannot reach Kafka at b1:9092")


def test_a_delivery_keeps_it_ready_for_stale_after_seconds() -> None:
    clock = FakeClock(100.0)
    readiness = Readiness(stale_after_s=5.0, clock=clock)
    clock.advance(30.0)
    readiness.delivered()

    clock.advance(5.0)
    assert readiness.check() == (True, "ok")
    clock.advance(1.5)
    ready, reason = readiness.check()
    assert not ready
    assert "6.5s ago" in reason


def test_alive_while_the_loop_turns_however_long_no_tick_is_delivered() -> None:
    clock = FakeClock(100.0)
    liveness = Liveness(stalled_after_s=20.0, clock=clock)
    for _ in range(600):  # ten minutes of a loop turning without a broker
        clock.advance(1.0)
        liveness.beat()
        assert liveness.check() == (True, "ok")

    clock.advance(20.5)
    alive, reason = liveness.check()
    assert not alive
    assert "has not turned for 20.5s" in reason


@pytest.fixture
def served() -> Iterator[tuple[str, FakeClock, Readiness, OscillatorMetrics]]:
    clock = FakeClock(0.0)
    readiness = Readiness(stale_after_s=5.0, clock=clock)
    metrics = OscillatorMetrics()
    server = HealthServer("127.0.0.1", 0, Liveness(clock=clock), readiness, metrics)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", clock, readiness, metrics
    finally:
        server.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - local test server
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readyz_over_http_turns_503_with_a_reason_when_deliveries_stop_healthz_stays_200(served) -> None:
    base, clock, readiness, _ = served
    readiness.delivered()
    assert get(f"{base}/readyz") == (200, "ok")

    clock.advance(8.0)
    status, body = get(f"{base}/readyz")
    assert status == 503
    assert "last tick delivered 8.0s ago" in body
    assert get(f"{base}/healthz") == (200, "ok")


def test_metrics_over_http_show_deliveries_errors_and_last_second(served) -> None:
    base, _, _, metrics = served
    for _ in range(4):
        metrics.delivered(1_700_000_001)
    metrics.delivered(1_700_000_000)  # a late report of an older second must not move the gauge back
    metrics.failed()

    status, body = get(f"{base}/metrics")
    assert status == 200
    lines = set(body.splitlines())
    assert "timers_oscillator_ticks_delivered_total 5.0" in lines
    assert "timers_oscillator_produce_errors_total 1.0" in lines
    assert "timers_oscillator_last_second_delivered 1.700000001e+09" in lines


def test_unknown_path_is_404(served) -> None:
    base, _, _, _ = served
    assert get(f"{base}/")[0] == 404


def test_metrics_of_two_instances_in_one_process_do_not_collide() -> None:
    first, second = OscillatorMetrics(), OscillatorMetrics()
    first.delivered(10)

    assert first.registry.get_sample_value("timers_oscillator_ticks_delivered_total") == 1.0
    assert second.registry.get_sample_value("timers_oscillator_ticks_delivered_total") == 0.0
