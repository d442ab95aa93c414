"""A callback built ahead of its tick is the one sent only while its timer is stored as it was
built from; what the built callbacks hold is counted while they are held, and given back."""

from __future__ import annotations

from futures.worker.built_ahead import BuiltAhead
from futures.worker.context import CALLBACK_OVERHEAD_BYTES
from futures.worker.prepare import prepare
from futures.worker.table import table_key
from ktimers.wire import Future, StoredTimer


def _stored(timer_id: str, payload: bytes) -> tuple[bytes, bytes]:
    future = Future(callBackTopic="cb", callBackKey="k", callBack=payload, id=timer_id, due_ms=5_000)
    return table_key(5_000, timer_id), StoredTimer(future=future, source_partition=0).SerializeToString()


def test_a_timer_changed_since_its_callback_was_built_is_built_again() -> None:
    built = BuiltAhead()
    (key_a, a), (key_b, b) = _stored("a", b"one"), _stored("b", b"two")
    built.fill(0, [(key_a, a), (key_b, b)])
    assert built.count == 2
    assert built.held == sum(len(v) + len(p) + CALLBACK_OVERHEAD_BYTES for v, p in ((a, b"one"), (b, b"two")))

    _, b_changed = _stored("b", b"TWO")
    _, c = _stored("c", b"three")
    key_c = table_key(5_000, "c")
    taken = list(built.take([(key_a, 0, a), (key_b, 0, b_changed), (key_c, 0, c)], []))

    assert [t.value for t in taken] == [b"one", b"TWO", b"three"]
    assert taken == [prepare(key_a, 0, a), prepare(key_b, 0, b_changed), prepare(key_c, 0, c)]
    assert (built.count, built.held) == (0, 0)


def test_building_a_timer_again_counts_it_once_and_dropping_a_partition_gives_its_bytes_back() -> None:
    built = BuiltAhead()
    key, first = _stored("a", b"x" * 100)
    _, second = _stored("a", b"y" * 10)
    built.fill(3, [(key, first)])
    built.fill(3, [(key, second)])
    built.fill(4, [_stored("b", b"z")])
    assert built.count == 2
    assert built.partitions() == [3, 4]

    built.drop(3)
    built.drop(9)  # none built: nothing to give back
    assert built.count == 1
    assert built.partitions() == [4]
    built.drop(4)
    assert (built.count, built.held) == (0, 0)


def test_a_timer_of_a_partition_with_nothing_built_is_built_at_the_tick() -> None:
    built = BuiltAhead()
    key, stored = _stored("a", b"p")
    assert list(built.take([(key, 2, stored)], [])) == [prepare(key, 2, stored)]


def test_a_timer_whose_bytes_cannot_be_built_is_not_built_ahead_and_is_handed_back_at_the_tick() -> None:
    built = BuiltAhead()
    (key_a, a), (key_b, b) = _stored("a", b"one"), _stored("b", b"two")
    unreadable = b"\x0a\x05ab"  # a length past the end
    built.fill(0, [(key_a, a), (key_b, unreadable)])
    assert built.count == 1

    refused: list[tuple[bytes, int, bytes]] = []
    taken = list(built.take([(key_a, 0, a), (key_b, 0, unreadable), (key_b, 1, b)], refused))

    assert taken == [prepare(key_a, 0, a), prepare(key_b, 1, b)]
    assert refused == [(key_b, 0, unreadable)]
    assert (built.count, built.held) == (0, 0)
