"""How the transport cuts fetched requests into engine steps (the backlog), and what it tells Faust."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from faust.sensors.monitor import Monitor
from faust.types import TP

from futures.worker import faust_adapter
from futures.worker.transport import CHUNK_BYTES, RequestBacklog, TimerConsumer


def records(n: int, size: int, first_ms: int = 1_000, first_offset: int = 0) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(value=b"x" * size, timestamp=first_ms + i, offset=first_offset + i) for i in range(n)
    ]


#: When the last fetch response of a partition came, in these tests (epoch ms).
FETCHED_MS = 9_000


def fetched(
    highwater: int | None, position: int | None, at_ms: int = FETCHED_MS
) -> faust_adapter.FetchPosition:
    """A partition's fetch state: its high watermark and position as of a response received ``at_ms``."""
    return faust_adapter.FetchPosition(highwater, position, at_ms)


def test_steps_keep_every_record_in_order_bounded_by_count_and_bytes() -> None:
    small, big = records(5, 10), records(3, CHUNK_BYTES // 2 + 1)
    backlog = RequestBacklog()
    backlog.add("p0", small, 7)  # any hashable stands for a TP
    backlog.add("p1", big, 7)
    assert backlog.records == 8
    steps = []
    while backlog:
        steps.append(backlog.take(7, 3))
    assert [[(tp, len(part)) for tp, part in step] for step in steps] == [
        [("p0", 3)],
        [("p0", 2), ("p1", 1)],  # three records
        [("p1", 2)],  # two big values pass the byte bound
    ]
    assert [r for step in steps for _, part in step for r in part] == small + big
    assert backlog.records == 0
    assert backlog.take(7, 3) == []


def test_records_fetched_before_a_rebalance_are_dropped_not_applied() -> None:
    backlog = RequestBacklog()
    old, new = records(4, 10), records(2, 10)
    backlog.add("p0", old, 1)
    backlog.add("p0", new, 2)
    # Generation 2: the first batch was fetched in generation 1 and is not acked, so the
    # partition's owner now reads it again from the committed (or resume) position.
    assert backlog.take(2, 10) == [("p0", new)]
    assert backlog.records == 0 and not backlog


def test_applied_requests_count_as_stream_activity_for_fausts_liveness_check(monkeypatch) -> None:
    # Requests skip Faust's per-event stream; without this, a worker working through a backlog
    # for longer than stream_processing_timeout logs "Stream has not started processing" errors.
    monitor = Monitor()
    applied: list[list[int]] = []

    async def apply(records: list[object]) -> None:
        applied.append([r.offset for r in records])  # type: ignore[attr-defined]

    tp = TP("timer-request", 2)
    acked: dict[TP, list[int]] = {}
    monkeypatch.setattr(
        faust_adapter, "ack_offsets", lambda consumer, tp, offsets: acked.setdefault(tp, []).extend(offsets)
    )
    consumer = SimpleNamespace(app=SimpleNamespace(consumer_generation_id=7, monitor=monitor))
    fields = {"topic": tp.topic, "partition": 2, "key": None, "value": b"v", "headers": [], "timestamp": 1}
    batch = [SimpleNamespace(offset=offset, **fields) for offset in (5, 6)]
    before = time.monotonic()
    asyncio.run(TimerConsumer._apply(consumer, apply, [(tp, batch)], 7))  # type: ignore[arg-type]
    assert applied == [[5, 6]] and acked == {tp: [5, 6]}
    assert monitor.stream_inbound_time[tp] >= before


def test_the_frontier_is_the_oldest_request_in_hand_then_the_last_taken_until_caught_up() -> None:
    backlog = RequestBacklog()
    # Nothing fetched yet: whatever the broker holds is unknown, so nothing may pass.
    assert backlog.frontier_ms("p0", faust_adapter.FetchPosition(None, None, None)) == -1
    assert backlog.frontier_ms("p0", fetched(5, 5)) == FETCHED_MS  # read to the end then
    backlog.add("p0", records(4, 10, first_ms=7_000, first_offset=5), 1)
    backlog.add("p1", records(1, 10, first_ms=3_000), 1)
    assert backlog.frontier_ms("p0", fetched(9, 9)) == 7_000
    step = backlog.take(1, 2)  # two of p0's, being applied
    assert backlog.frontier_ms("p0", fetched(9, 9)) == 7_000  # not applied yet
    backlog.applied(step)
    assert backlog.frontier_ms("p0", fetched(9, 9)) == 7_002
    step = backlog.take(1, 3)  # the rest of p0's, and p1's
    assert backlog.frontier_ms("p0", fetched(9, 9)) == 7_002  # still being applied
    backlog.applied(step)
    assert backlog.frontier_ms("p0", fetched(12, 9)) == 7_003  # the broker holds more
    assert backlog.frontier_ms("p0", fetched(9, 9)) == FETCHED_MS
    assert backlog.partitions() == set()
    backlog.clear()  # a rebalance: what was applied before says nothing of the new position
    assert backlog.frontier_ms("p0", fetched(12, 9)) == -1


def test_read_to_the_end_means_as_of_the_fetch_response_that_said_so() -> None:
    # A request written after the last response of its partition (one left out of fetches
    # while its backlog drains) is in no high watermark seen yet: a tick of a later second
    # waits for a newer response.
    backlog = RequestBacklog()
    backlog.add("p0", records(2, 10, first_ms=7_000, first_offset=0), 1)
    backlog.applied(backlog.take(1, 2))
    assert backlog.frontier_ms("p0", fetched(2, 2, at_ms=8_500)) == 8_500
    assert backlog.frontier_ms("p0", fetched(2, 2, at_ms=12_004)) == 12_004


def test_records_handed_over_and_not_yet_taken_in_hand_are_waited_for() -> None:
    backlog = RequestBacklog()
    backlog.taken_to({"p0": 5, "p1": None})  # before a hand-over: everything before 5 is taken
    # The fetcher moved the position to 9 (records 5-8 on their way): not read to the end.
    assert backlog.frontier_ms("p0", fetched(9, 9)) == -1
    backlog.add("p0", records(4, 10, first_ms=7_000, first_offset=5), 1)
    assert backlog.frontier_ms("p0", fetched(9, 9)) == 7_000
    backlog.applied(backlog.take(1, 4))
    assert backlog.frontier_ms("p0", fetched(9, 9)) == FETCHED_MS
    assert backlog.frontier_ms("p1", fetched(3, 3)) == FETCHED_MS  # no position noted: as it says


def test_a_step_left_to_be_read_again_does_not_count_as_applied() -> None:
    backlog = RequestBacklog()
    backlog.add("p0", records(2, 10, first_ms=7_000), 1)
    backlog.applied(backlog.take(1, 1))
    step = backlog.take(1, 1)  # fetched before a rebalance the consumer noticed too late
    backlog.applied(step, done=False)
    # The broker holds it still (read again from the committed offset): ticks after 7,000 wait.
    assert backlog.frontier_ms("p0", fetched(2, 1)) == 7_000


def test_the_backlog_counts_the_bytes_it_holds() -> None:
    backlog = RequestBacklog()
    backlog.add("p0", records(3, 1000), 1)
    backlog.add("p1", records(2, 500), 1)
    assert backlog.bytes == 4000
    backlog.take(1, 4)
    assert backlog.bytes == 500
    backlog.clear()
    assert backlog.bytes == 0
