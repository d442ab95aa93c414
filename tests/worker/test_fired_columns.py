"""A piece of fired timers is recorded as its callbacks say: each FIRED column per partition in
their order, each one's lateness, and each key deleted from its own partition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futures.worker.callbacks import Callback
from futures.worker.fired_columns import fired_columns, keys_by_partition

_callbacks = st.lists(
    st.builds(
        Callback,
        key=st.binary(min_size=1, max_size=12),
        partition=st.integers(0, 3),
        topic=st.just("cb"),
        record_key=st.just(b"k"),
        value=st.just(b"v"),
        timer_id=st.text(max_size=6),
        due_ms=st.integers(0, 2**40),
        source_offset=st.integers(-1, 2**40),
        id_header=st.just(b""),
        due_header=st.just(b""),
        own_headers=st.just(()),
        token=st.just(b""),
        occurrence=st.integers(0, 3),
    ),
    max_size=40,
)


@given(callbacks=_callbacks, data=st.data())
def test_the_columns_and_keys_of_a_piece_are_those_of_its_callbacks_in_order(
    callbacks: list[Callback], data: st.DataObject
) -> None:
    fired = data.draw(st.lists(st.integers(0, 2**40), min_size=len(callbacks), max_size=len(callbacks)))
    columns, lateness = fired_columns(callbacks, fired)
    partitions = sorted({c.partition for c in callbacks})
    assert sorted(columns) == partitions
    for partition in partitions:
        mine = [c for c in callbacks if c.partition == partition]
        assert columns[partition] == (
            [c.timer_id for c in mine],
            [c.due_ms for c in mine],
            [c.source_offset for c in mine],
        )
    assert lateness == [max(f - c.due_ms, 0) for c, f in zip(callbacks, fired, strict=True)]
    keys, recurring = keys_by_partition(callbacks)
    assert keys == {p: [c.key for c in callbacks if c.partition == p] for p in partitions}
    assert recurring == [c for c in callbacks if c.occurrence]


@pytest.mark.parametrize("wrong", ["not a callback", ("too", "short"), None])
def test_what_is_no_callback_is_refused_instead_of_read_past(wrong: object) -> None:
    with pytest.raises(TypeError, match="a Callback is needed"):
        fired_columns([wrong], [0])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a Callback is needed"):
        keys_by_partition([wrong])  # type: ignore[list-item]


def test_a_dispatch_time_is_needed_for_each_callback() -> None:
    callback = Callback(b"t", 0, "cb", b"k", b"v", "id", 5, 0, b"", b"", (), b"")
    with pytest.raises(ValueError, match="1 callbacks but 0 dispatch times"):
        fired_columns([callback], [])
