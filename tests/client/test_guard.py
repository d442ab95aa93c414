"""Token guards: a receiver acts on exactly one callback per armed token."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from futures.client.guard import MemoryTokenGuard, RocksDBTokenGuard, TokenGuard
from ktimers.errors import TimersError
from ktimers.wire import H_DUE_MS, H_ID, H_TOKEN


def callback_headers(token: str | None) -> list[tuple[str, bytes | None]]:
    """Headers as the worker writes them on a callback (confluent ``msg.headers()`` shape)."""
    headers: list[tuple[str, bytes | None]] = [(H_ID, b"t-1"), (H_DUE_MS, b"1800000000000")]
    if token is not None:
        headers.append((H_TOKEN, token.encode()))
    headers.append(("user", None))
    return headers


@pytest.fixture(params=["memory", "rocksdb"])
def guard(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TokenGuard]:
    g: TokenGuard = MemoryTokenGuard() if request.param == "memory" else RocksDBTokenGuard(tmp_path / "guard")
    yield g
    g.close()


def test_armed_callback_is_accepted_once(guard):
    token = guard.arm("order-42")
    assert guard.accept("order-42", callback_headers(token)) is True
    # The same callback delivered again (a retry, a replay) is dropped.
    assert guard.accept("order-42", callback_headers(token)) is False


def test_rearming_drops_the_superseded_timers_callback(guard):
    old = guard.arm("order-42")
    new = guard.arm("order-42")
    assert old != new
    assert guard.accept("order-42", callback_headers(old)) is False
    assert guard.accept("order-42", callback_headers(new)) is True


def test_disarmed_timer_callback_is_dropped(guard):
    token = guard.arm("order-42")
    guard.disarm("order-42")
    assert guard.accept("order-42", callback_headers(token)) is False
    guard.disarm("never-armed")  # harmless


@pytest.mark.parametrize("headers", [None, [], callback_headers(None), [(H_TOKEN, None)], [(H_TOKEN, b"")]])
def test_callback_without_a_token_is_dropped_and_keeps_the_armed_one(guard, headers):
    token = guard.arm("order-42")
    assert guard.accept("order-42", headers) is False
    assert guard.accept("order-42", callback_headers(token)) is True


def test_a_token_only_opens_its_own_name(guard):
    a = guard.arm("a")
    b = guard.arm("b")
    assert guard.accept("b", callback_headers(a)) is False
    assert guard.accept("a", callback_headers(a)) is True
    assert guard.armed("b") == b


def test_concurrent_duplicates_are_accepted_once(guard):
    token = guard.arm("order-42")
    results: list[bool] = []
    start = threading.Barrier(8)

    def receive() -> None:
        start.wait()
        results.append(guard.accept("order-42", callback_headers(token)))

    threads = [threading.Thread(target=receive) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_closed_guard_refuses_use(guard):
    guard.close()
    with pytest.raises(TimersError, match="closed"):
        guard.arm("x")


def test_rocksdb_guard_survives_a_restart(tmp_path):
    path = tmp_path / "guard"
    with RocksDBTokenGuard(path) as guard:
        pending = guard.arm("pending")
        done = guard.arm("done")
        assert guard.accept("done", callback_headers(done)) is True
        cancelled = guard.arm("cancelled")
        guard.disarm("cancelled")

    with RocksDBTokenGuard(str(path)) as guard:
        assert guard.accept("pending", callback_headers(pending)) is True
        assert guard.accept("done", callback_headers(done)) is False
        assert guard.accept("cancelled", callback_headers(cancelled)) is False


def test_rocksdb_guard_directory_is_exclusive(tmp_path):
    with RocksDBTokenGuard(tmp_path / "guard"):
        with pytest.raises(TimersError, match="its own directory"):
            RocksDBTokenGuard(tmp_path / "guard")
