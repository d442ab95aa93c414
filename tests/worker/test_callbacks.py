"""A callback holds what it sends, not the stored timer: what the rare paths rebuild from it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from futures.worker.callbacks import stored_timer
from futures.worker.prepare import prepare
from futures.worker.table import table_key
from ktimers.wire import StoredTimer

_text = st.text(max_size=30)


@given(
    topic=_text,
    key=_text,
    value=st.binary(max_size=200),
    timer_id=st.text(min_size=1, max_size=40),
    due_ms=st.integers(0, 2**53),
    token=_text,
    headers=st.lists(st.tuples(st.text(min_size=1, max_size=10), st.binary(max_size=20)), max_size=4),
    offset=st.integers(0, 2**62),
)
def test_a_callback_whose_timer_left_the_table_still_rebuilds_what_its_dead_letter_needs(
    topic: str,
    key: str,
    value: bytes,
    timer_id: str,
    due_ms: int,
    token: str,
    headers: list[tuple[str, bytes]],
    offset: int,
) -> None:
    timer = StoredTimer(source_partition=3, source_offset=offset)
    future = timer.future
    future.callBackTopic, future.callBackKey, future.callBack = topic, key, value
    future.id, future.due_ms, future.token = timer_id, due_ms, token
    for name, header in headers:
        future.headers.add(key=name, value=header)
    stored = timer.SerializeToString()
    callback = prepare(table_key(due_ms, timer_id), 3, stored)

    assert stored_timer(callback, stored) == timer  # read from the table while it holds it
    assert stored_timer(callback, None) == timer  # cancelled meanwhile: rebuilt from the callback
