"""A read of due timers takes the first of them up to its count and its bytes, and reads no
timer past those it returns: a timer read is a timer held in memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futures.worker.table_read import take_due

_items = st.lists(st.tuples(st.binary(min_size=1, max_size=8), st.binary(max_size=40)), max_size=30)


@given(items=_items, max_count=st.integers(-2, 40), max_bytes=st.none() | st.integers(-5, 400))
def test_a_read_takes_a_prefix_within_its_count_and_bytes_and_nothing_past_it(
    items: list[tuple[bytes, bytes]], max_count: int, max_bytes: int | None
) -> None:
    source = iter(items)
    found = take_due(source, max_count, max_bytes)
    assert found == items[: len(found)]
    assert list(source) == items[len(found) :]  # the rest is still to be read
    if max_count <= 0:
        assert found == []
        return
    assert len(found) <= max_count
    sizes = [len(value) for _, value in found]
    if max_bytes is not None:
        # Every value but the last left room: the last is the one that reached the bytes.
        assert len(found) <= 1 or sum(sizes[:-1]) < max_bytes
    # It stopped only at the end of the items, at the count, or at the bytes.
    at_count = len(found) == max_count
    at_bytes = max_bytes is not None and found != [] and sum(sizes) >= max_bytes
    assert len(found) == len(items) or at_count or at_bytes


def test_a_read_with_no_room_still_takes_one_timer() -> None:
    items = [(b"a", b"x" * 10), (b"b", b"y")]
    assert take_due(iter(items), 5, 0) == items[:1]
    assert take_due(iter(items), 5, 10) == items[:1]
    assert take_due(iter(items), 5, 11) == items


def test_values_that_are_not_bytes_are_refused() -> None:
    with pytest.raises(TypeError):
        take_due(iter([(b"a", 5)]), 3, 10)
