"""/healthz follows the loop (alive), /readyz deliveries (not produce calls); /metrics serves the
oscillator's own registry."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oscillator.health import HealthServer, HttpLimits, Liveness, Readiness
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


#: Short, so that the tests wait little for what a server with the defaults does in 5 s.
LIMITS = HttpLimits(request_timeout_s=0.5, max_request_bytes=1024, max_connections=4)


def serve_limited() -> Iterator[int]:
    """A server with :data:`LIMITS` on 127.0.0.1, while iterated; its port."""
    clock = FakeClock(0.0)
    server = HealthServer(
        "127.0.0.1", 0, Liveness(clock=clock), Readiness(5.0, clock), OscillatorMetrics(), LIMITS
    )
    server.start()
    try:
        yield server.port
    finally:
        server.stop()


limited = pytest.fixture(serve_limited, name="limited")
#: One server for every example of the fuzz test.
fuzzed = pytest.fixture(serve_limited, name="fuzzed", scope="module")


def seconds_until_closed(client: socket.socket, wait_s: float = 5.0) -> float:
    """How long until the server closes ``client`` (reads what it answers on the way)."""
    start = time.monotonic()
    client.settimeout(wait_s)
    try:
        while client.recv(4096):
            pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {wait_s}s")
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_a_silent_client_is_dropped_by_the_server_the_oscillator_runs(served) -> None:
    """The defaults, as ``oscillator.service.run`` builds the server: a probe that connects and
    never sends does not hold a thread for longer than a few seconds."""
    base, _, _, _ = served
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as silent:
        waited_s = seconds_until_closed(silent, wait_s=HttpLimits().request_timeout_s + 5.0)
    assert waited_s < HttpLimits().request_timeout_s + 1.0


def test_a_client_that_sends_nothing_is_dropped_and_others_are_answered_meanwhile(limited: int) -> None:
    with socket.create_connection(("127.0.0.1", limited)) as silent:
        assert get(f"http://127.0.0.1:{limited}/healthz") == (200, "ok")
        waited_s = seconds_until_closed(silent)
    assert waited_s < LIMITS.request_timeout_s + 1.0
    assert get(f"http://127.0.0.1:{limited}/healthz") == (200, "ok")


def test_a_client_that_drips_its_request_is_dropped_within_the_timeout(limited: int) -> None:
    """Each byte comes well inside the timeout; the whole request does not."""
    with socket.create_connection(("127.0.0.1", limited)) as dripping:
        start = time.monotonic()
        request = b"GET /healthz HTTP/1.0\r\nX-Padding: " + b"x" * 200
        try:
            for byte in request:
                dripping.sendall(bytes([byte]))
                time.sleep(LIMITS.request_timeout_s / 10)
        except (BrokenPipeError, ConnectionResetError):
            pass
        seconds_until_closed(dripping)
        assert time.monotonic() - start < LIMITS.request_timeout_s + 1.0
    assert get(f"http://127.0.0.1:{limited}/readyz")[0] == 503


def test_a_request_over_the_byte_budget_is_431_and_not_read_further(limited: int) -> None:
    with socket.create_connection(("127.0.0.1", limited)) as client:
        client.sendall(
            b"GET /healthz HTTP/1.0\r\nX-Padding: " + b"x" * 2 * LIMITS.max_request_bytes + b"\r\n\r\n"
        )
        client.settimeout(5.0)
        assert client.recv(64).startswith(b"HTTP/1.0 431")
    assert get(f"http://127.0.0.1:{limited}/healthz") == (200, "ok")


def test_connections_over_the_limit_are_closed_at_once_until_held_ones_are_dropped(limited: int) -> None:
    held = [socket.create_connection(("127.0.0.1", limited)) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)  # every one of them taken by a thread
        with socket.create_connection(("127.0.0.1", limited)) as over:
            assert seconds_until_closed(over) < LIMITS.request_timeout_s / 2
        for one in held:
            seconds_until_closed(one)
        assert get(f"http://127.0.0.1:{limited}/healthz") == (200, "ok")
    finally:
        for one in held:
            one.close()


@settings(max_examples=60, deadline=None, database=None)
@given(
    request=st.one_of(
        st.binary(max_size=2 * LIMITS.max_request_bytes),
        st.builds(
            lambda line, headers: line + b"\r\n" + headers + b"\r\n\r\n",
            st.sampled_from([b"GET /healthz HTTP/1.0", b"GET /metrics HTTP/1.1", b"POST / HTTP/1.0", b"GET"]),
            st.binary(max_size=2 * LIMITS.max_request_bytes),
        ),
    )
)
def test_any_bytes_get_an_answer_or_a_close_and_the_server_keeps_answering(
    fuzzed: int, request: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", fuzzed)) as client:
        try:
            client.sendall(request)
            client.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert seconds_until_closed(client) < LIMITS.request_timeout_s + 1.0
    assert get(f"http://127.0.0.1:{fuzzed}/healthz") == (200, "ok")


def test_metrics_of_two_instances_in_one_process_do_not_collide() -> None:
    first, second = OscillatorMetrics(), OscillatorMetrics()
    first.delivered(10)

    assert first.registry.get_sample_value("timers_oscillator_ticks_delivered_total") == 1.0
    assert second.registry.get_sample_value("timers_oscillator_ticks_delivered_total") == 0.0
