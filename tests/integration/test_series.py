"""Recurring timers end to end: occurrences with ordinals, a cancel mid-series, a SIGKILL between two."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

import pytest

from ktimers.recurrence import H_OCCURRENCE
from ktimers.wire import header_value
from tests.integration.conftest import Callback, Stack

pytestmark = pytest.mark.integration


def ordinal(callback: Callback) -> int:
    return int(header_value(callback.headers, H_OCCURRENCE) or 0)


def test_an_every_second_series_fires_its_occurrences_and_a_cancel_stops_it(running: Stack) -> None:
    reader = running.callback_topic("series")
    with running.client() as client:
        endless = client.schedule(reader.topic, "tick", b"endless", every=timedelta(seconds=1))
        client.schedule(reader.topic, "tick", b"three", every=1, max_count=3, id="three-times")
    reader.read_until(lambda r: sum(c.value == b"endless" for c in r) >= 4, timeout_s=30)
    with running.client() as client:
        client.cancel(endless)
    reader.poll(2.5)  # an occurrence may have been on its way when the cancel was applied
    settled = len(reader.records)
    reader.poll(2.5)
    assert len(reader.records) == settled, "the series went on after its cancel"

    for name, count in ((b"endless", None), (b"three", 3)):
        got = [c for c in reader.records if c.value == name]
        ordinals = [ordinal(c) for c in got]
        assert ordinals == list(range(1, len(got) + 1)), ordinals
        if count is not None:
            assert len(got) == count
        dues = [c.due_ms for c in got]
        # Due a second apart, each delivered at or after its due time.
        assert all(b - a == 1000 for a, b in zip(dues, dues[1:], strict=False)), dues
        assert all(c.received_ms >= c.due_ms for c in got)


def test_sigkill_between_two_occurrences_loses_none_and_arms_none_twice(running: Stack) -> None:
    reader = running.callback_topic("series-kill")
    with running.client() as client:
        client.schedule(reader.topic, "k", b"v", every=2, id="survivor")
    reader.read_until(lambda r: len(r) >= 2, timeout_s=30)
    assert running.worker is not None
    running.worker.kill()  # between occurrence 2 and 3
    killed_at = time.time()
    running.start_worker()
    reader.read_until(lambda r: max(map(ordinal, r)) >= 5, timeout_s=60)

    due_of: dict[int, set[int]] = defaultdict(set)
    for callback in reader.records:
        due_of[ordinal(callback)].add(callback.due_ms)
    top = max(due_of)
    assert sorted(due_of) == list(range(1, top + 1)), f"an occurrence was lost: {sorted(due_of)}"
    # One due time per ordinal: a repeat after the kill is the same occurrence, never a second series.
    assert all(len(dues) == 1 for dues in due_of.values()), dict(due_of)
    dues = [next(iter(due_of[n])) for n in range(1, top + 1)]
    assert all(b > a and (b - a) % 2000 == 0 for a, b in zip(dues, dues[1:], strict=False)), dues
    assert all(c.received_ms >= c.due_ms for c in reader.records)
    print(
        f"\nseries across a SIGKILL: ordinals 1..{top}, "
        f"restart to occurrence 5 {time.time() - killed_at:.1f}s"
    )
