"""How the transport cuts fetched requests into engine steps (the backlog), and what it tells Faust."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from faust.sensors.monitor import Monitor
from faust.types import TP

from futures.worker import faust_adapter
from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.transport import (
    BACKLOG_STEPS,
    CHUNK_BYTES,
    BulkRoute,
    RequestBacklog,
    TimerConsumer,
    TimerConsumerThread,
    route_in_bulk,
)


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


class _Fetcher:
    """Stands in for aiokafka's consumer and fetcher: per partition, the next offset it hands out.
    Its fetch is answered after ``meanwhile`` ran, as aiokafka answers one asked for before a
    rebalance once the new assignment is in: with records of it, its positions past them."""

    def __init__(
        self, positions: dict[TP, int], answer: dict[TP, int], meanwhile: Callable[[], None]
    ) -> None:
        self.positions = positions
        self._answer, self._meanwhile = answer, meanwhile  # records per partition
        self._closed = False
        self._fetcher = self
        self._subscriptions = SimpleNamespace(fetch_context=contextlib.nullcontext)

    async def fetched_records(
        self, partitions: set[TP], timeout: float = 0, max_records: int | None = None
    ) -> dict[TP, list[SimpleNamespace]]:
        self._meanwhile()
        handed = {}
        for tp, n in self._answer.items():
            first = self.positions[tp]
            handed[tp] = [SimpleNamespace(offset=first + i) for i in range(n)]
            self.positions[tp] = first + n
        return handed

    def seek(self, tp: TP, offset: int) -> None:
        self.positions[tp] = offset


def _consumer_thread(tmp_path: Path) -> Any:
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    thread = create_app(config, partitions=4).app.consumer._thread
    assert isinstance(thread, TimerConsumerThread)
    return thread


def test_what_a_fetch_hands_out_once_flow_stopped_is_read_again(tmp_path: Path) -> None:
    # A fetch asked for before a rebalance came back with the changelog records table recovery
    # had just sought to, while flow was still stopped: dropped, and recovery waited forever.
    thread = _consumer_thread(tmp_path)
    changelog, request = TP("t-timers-changelog", 0), TP("timer-request", 0)
    stop_flow = thread.consumer.stop_flow  # what the rebalance does while the fetch waits
    fetcher = _Fetcher({changelog: 700, request: 680}, {changelog: 285, request: 26}, stop_flow)

    records = asyncio.run(thread._fetch_records(fetcher, {request}, timeout=1.0))

    assert records == {}
    assert fetcher.positions == {changelog: 700, request: 680}


def test_a_fetch_while_flow_runs_hands_out_what_it_got(tmp_path: Path) -> None:
    thread = _consumer_thread(tmp_path)
    changelog = TP("t-timers-changelog", 0)
    fetcher = _Fetcher({changelog: 700}, {changelog: 3}, lambda: None)

    records = asyncio.run(thread._fetch_records(fetcher, {changelog}, timeout=1.0))

    assert [r.offset for r in records[changelog]] == [700, 701, 702]
    assert fetcher.positions == {changelog: 703}


def test_a_resume_while_requests_are_held_reaches_the_next_fetch(tmp_path: Path) -> None:
    # Table recovery pauses the stream partitions and resumes its changelog ones while the
    # backlog may hold enough requests that their partition is left out of the fetch: the
    # pause and the resume must reach the partitions Faust keeps, and the fetch leave out
    # only the held partition.
    thread = _consumer_thread(tmp_path)
    consumer = thread.consumer
    request, tick = TP("timer-request", 0), TP("oscillator", 0)
    changelog, other = TP("t-timers-changelog", 0), TP("timer-request", 1)

    async def nothing(*_: Any) -> None:
        return None

    batch = 10
    route = BulkRoute(frozenset({request.topic}), nothing, tick.topic, lambda _: None, lambda: None, batch)
    route_in_bulk(consumer.app, route)
    consumer._active_partitions = {request, other, tick}
    consumer._backlog.add(request, records(batch * BACKLOG_STEPS, 10), 0)
    asked: list[set[TP]] = []

    async def getmany(partitions: set[TP], timeout: float) -> dict[TP, list[Any]]:
        asked.append(set(partitions))
        return {}

    thread.getmany = getmany

    consumer.pause_partitions([other])
    consumer.resume_partitions([changelog])
    asyncio.run(consumer._getmany(consumer._get_active_partitions(), 0.0))

    assert consumer._get_active_partitions() == {request, tick, changelog}
    assert asked == [{tick, changelog}]
