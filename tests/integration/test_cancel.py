"""Cancelling: by request (with a definite answer on `timer-events`), by reschedule, and by token."""

from __future__ import annotations

import time

import pytest

from futures.client.guard import MemoryTokenGuard
from ktimers.wire import TimerEvent, decode_events
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

Kind = TimerEvent.Kind


def events_by_id(stack: Stack, ids: set[str], until: int, timeout_s: float = 15) -> dict[str, list[int]]:
    """Event kinds per timer id, once ``until`` kinds have been seen in total for ``ids``."""
    reader = stack.reader(stack.common.topics.events)
    found: dict[str, list[int]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reader.poll(0.3)
        found = {}
        for record in reader.records:
            for event in decode_events(record.value, record.headers):
                if event.id in ids:
                    found.setdefault(event.id, []).append(event.kind)
        if sum(len(v) for v in found.values()) >= until:
            break
    return found


def test_cancel_before_due_never_fires_and_says_so(running: Stack) -> None:
    reader = running.callback_topic("cancel")
    with running.client() as client:
        cancelled = client.schedule(reader.topic, "a", "cancelled", delay=4)
        kept = client.schedule(reader.topic, "b", "kept", delay=4)
        client.flush()
        client.cancel(cancelled)
    callbacks = reader.read_until(lambda r: len(r) >= 1, timeout_s=20)
    reader.poll(2.0)
    assert [(c.key, c.value) for c in callbacks] == [(b"b", b"kept")]
    # Cancelling after it fired: the answer is "missed", not "cancelled".
    with running.client() as client:
        client.cancel(kept)
    events = events_by_id(running, {cancelled.id, kept.id}, until=5)
    assert events[cancelled.id] == [Kind.SCHEDULED, Kind.CANCELLED]
    assert events[kept.id] == [Kind.SCHEDULED, Kind.FIRED, Kind.CANCEL_MISSED]
    assert running.metric_sum("timers_pending") == 0


def test_reschedule_by_id_fires_only_the_latest(running: Stack) -> None:
    reader = running.callback_topic("reschedule")
    with running.client() as client:
        client.schedule(reader.topic, "r", "first", delay=2, id="reminder-1")
        client.schedule(reader.topic, "r", "second", delay=3, id="reminder-1")
        client.schedule(reader.topic, "r", "third", delay=4, id="reminder-1")
    callbacks = reader.read_until(lambda r: len(r) >= 1, timeout_s=20)
    reader.poll(3.0)
    assert [(c.timer_id, c.value) for c in reader.records] == [("reminder-1", b"third")]
    assert callbacks[0].received_ms >= callbacks[0].due_ms


def test_token_guard_drops_cancelled_and_repeated_callbacks(running: Stack) -> None:
    """The seed's pattern: the receiver re-arms to cancel, and accepts only the armed token, once."""
    reader = running.callback_topic("guard")
    guard = MemoryTokenGuard()
    with running.client() as client:
        first = guard.arm("order-17")
        client.schedule(reader.topic, "order-17", "remind v1", delay=1, token=first)
        second = guard.arm("order-17")  # supersedes (cancels) the first timer
        client.schedule(reader.topic, "order-17", "remind v2", delay=2, token=second)
    callbacks = reader.read_until(lambda r: len(r) >= 2, timeout_s=20)
    by_value = {c.value: c for c in callbacks}
    assert guard.accept("order-17", by_value[b"remind v1"].headers) is False  # cancelled
    assert guard.accept("order-17", by_value[b"remind v2"].headers) is True
    assert guard.accept("order-17", by_value[b"remind v2"].headers) is False  # a repeat
