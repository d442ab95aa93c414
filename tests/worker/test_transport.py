"""How the transport cuts fetched requests into engine steps (the backlog), and what it tells Faust."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import fetcher
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from faust.sensors.monitor import Monitor
from faust.types import TP

from futures.ingress.records import SourceRecord
from futures.worker import faust_adapter, fetch
from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.kafka import KafkaWriter
from futures.worker.passed import PassedOffsets
from futures.worker.transport import (
    BACKLOG_STEPS,
    CHUNK_BYTES,
    BulkRoute,
    RequestBacklog,
    TimerConsumer,
    TimerConsumerThread,
    route_in_bulk,
)
from futures.worker.wiring import ConsumerView
from tests.worker.rig import T_MS, Kind, Rig
from tests.worker.simulated_log import SimulatedFetcher, SimulatedLog


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
    consumer = SimpleNamespace(
        app=SimpleNamespace(consumer_generation_id=7, monitor=monitor),
        _passed=PassedOffsets(),
        _ack_spans=lambda tp, spans: None,
    )
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


# -- transactional producers, on a simulated log read by aiokafka's own fetch code -----------------


class CountingGapReader:
    """Reads holes back from the simulated log, counting each read (a round trip on a broker)."""

    def __init__(self, log: SimulatedLog, topic: str) -> None:
        self.log, self.topic = log, topic
        self.reads: list[tuple[int, int]] = []

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        self.reads.append((start, end))
        data, aborted = self.log.fetch(start, len(self.log.batches))
        tp = TopicPartition(topic, partition)
        # As librdkafka reads them back: committed transactions only.
        records = fetcher.PartitionRecords(tp, MemoryRecords(data), aborted, start, None, None, True, 1)
        return [
            SourceRecord(topic, partition, r.offset, r.key, r.value, (), r.timestamp)
            for r in records
            if r.offset < end
        ]


class TransactionalRig:
    """The worker's consumer (Faust's, with the worker's transport and consumer thread) on one
    request partition's :class:`SimulatedLog`, handing requests to a real engine (``rig``'s)."""

    def __init__(self, rig: Rig, tmp_path: Path, monkeypatch: Any, log: SimulatedLog) -> None:
        # What the worker installs at start; put back after the test.
        monkeypatch.setattr(fetcher, "MemoryRecords", fetcher.MemoryRecords)
        monkeypatch.setattr(fetcher, "PartitionRecords", fetcher.PartitionRecords)
        fetch.install()
        self.rig, self.log = rig, log
        topics = rig.config.common.topics
        self.tp = TP(topics.request, 0)
        config = WorkerConfig.from_env(
            {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
        )
        self.app = create_app(config, partitions=4).app
        consumer = self.app.consumer
        assert isinstance(consumer, TimerConsumer)
        self.consumer = consumer
        self.gaps = CountingGapReader(log, topics.request)
        rig.engine = TimerEngine(
            rig.config, rig.table, KafkaWriter(rig.producer), rig.metrics, clock=lambda: rig.now,
            gaps=self.gaps, read_past=ConsumerView(self.app),
        )  # fmt: skip
        route_in_bulk(
            self.app,
            BulkRoute(
                frozenset({topics.request}), rig.engine.ingest, topics.oscillator,
                rig.engine.note_ticks, rig.engine.wake, batch_size=7,
            ),
        )  # fmt: skip
        consumer._active_partitions = {self.tp}
        self.fetcher: SimulatedFetcher | None = None

    async def _start(self) -> SimulatedFetcher:
        thread = self.consumer._thread
        # The aiokafka consumer as the worker's thread builds it (its isolation level included).
        running = thread._create_consumer(loop=asyncio.get_running_loop())
        thread._consumer = running
        sim = SimulatedFetcher(running, {TopicPartition(self.tp.topic, 0): self.log}, max_batches=5)

        async def getmany(active: set[TP], timeout: float) -> Any:
            return await thread._fetch_records(sim, active, timeout=timeout)

        thread.getmany = getmany
        return sim

    def consume(self, rounds: int | None = None) -> None:
        """Read the log to its end (or ``rounds`` times) and apply every request, as the worker's
        fetch loop does."""

        async def run() -> None:
            sim = self.fetcher = self.fetcher or await self._start()
            for _ in range(rounds or 10 * len(self.log.batches) + 10):
                async for _ in self.consumer.getmany(timeout=0):
                    pass
                if (
                    sim.position(TopicPartition(self.tp.topic, 0)) == self.log.end
                    and not self.consumer._backlog
                ):
                    break
            await self.rig.engine.landed()

        asyncio.run(run())

    def commit(self) -> int | None:
        """What Faust's periodic commit commits of the request partition (None: nothing new)."""
        offset = self.consumer._new_offset(self.tp)
        if offset is not None:
            self.consumer._committed_offset[self.tp] = offset
        return offset

    def books(self) -> int:
        """Offsets in Faust's ack books, waiting for a commit."""
        return len(self.consumer._acked[self.tp]) + len(self.consumer._acked_index[self.tp])


def test_a_transactional_producers_markers_are_read_past_committed_past_and_never_read_back(
    rig: Rig, tmp_path: Path, monkeypatch: Any
) -> None:
    # Each commit writes a marker that takes an offset no consumer is handed: a hole after
    # every transaction. Faust commits acked offsets only to the first hole (it lets one pass
    # per commit), so a worker that did not ack markers advanced one transaction per commit,
    # its books growing, and read every hole back under the engine lock.
    log = SimulatedLog()
    for txn in range(50):
        requests = [rig.request(f"t{txn}-{i}", T_MS + 60_000 + txn).value or b"" for i in range(3)]
        log.write_in_transaction(7, requests)
        log.end_transaction(7, commit=True)
    worker = TransactionalRig(rig, tmp_path, monkeypatch, log)

    worker.consume()

    assert rig.metrics.scheduled._value.get() == 150
    assert worker.gaps.reads == [], "holes of transaction markers were read back"
    assert rig.metrics.request_gaps.labels("no-request")._value.get() == 49
    assert worker.commit() == log.end, "one commit reaches the end of the partition"
    assert worker.books() == 0


def test_requests_of_aborted_transactions_never_apply(rig: Rig, tmp_path: Path, monkeypatch: Any) -> None:
    log = SimulatedLog()
    at = T_MS + 60_000
    log.write_in_transaction(1, [rig.request("kept", at).value or b""])
    log.end_transaction(1, commit=True)
    # An aborted transaction, interleaved with a plain producer's request and another's commit.
    log.write_in_transaction(2, [rig.request("aborted", at).value or b""])
    log.write([rig.request("plain", at).value or b""])
    log.write_in_transaction(2, [rig.cancel("kept").value or b""], timestamp_ms=2_000)
    log.write_in_transaction(3, [rig.request("committed", at).value or b""])
    log.end_transaction(2, commit=False)
    log.end_transaction(3, commit=True)
    worker = TransactionalRig(rig, tmp_path, monkeypatch, log)

    worker.consume()

    assert sorted(rig.pending_ids()) == ["committed", "kept", "plain"]
    assert rig.events(Kind.CANCELLED) == [] and rig.dlq() == []
    assert worker.gaps.reads == []
    assert worker.commit() == log.end
    assert worker.books() == 0


def test_a_hole_the_consumer_did_not_read_past_is_still_read_back(
    rig: Rig, tmp_path: Path, monkeypatch: Any
) -> None:
    # Records handed out while their partition left Faust's active set (a rebalance under way)
    # are dropped, the position past them: that hole holds requests, and is read back.
    log = SimulatedLog()
    for n in range(3):
        log.write([rig.request(f"before-{n}", T_MS + 60_000).value or b""])
    worker = TransactionalRig(rig, tmp_path, monkeypatch, log)
    worker.consume()
    dropped = log.write_in_transaction(4, [rig.request("dropped", T_MS + 60_000).value or b""])
    marker = log.end_transaction(4, commit=True)
    assert worker.fetcher is not None
    worker.fetcher.handed_out = lambda: worker.consumer._active_partitions.discard(worker.tp)
    worker.consume(rounds=1)
    assert worker.fetcher.position(TopicPartition(worker.tp.topic, 0)) == marker + 1
    worker.consumer._active_partitions.add(worker.tp)
    worker.fetcher.handed_out = lambda: None
    log.write([rig.request("after", T_MS + 60_000).value or b""])
    worker.consume()

    assert worker.gaps.reads == [(dropped[0], marker + 1)]
    assert sorted(rig.pending_ids()) == ["after", "before-0", "before-1", "before-2", "dropped"]


def test_the_frontier_is_when_the_fetch_request_was_sent_not_when_its_response_was_read() -> None:
    # A cancel written after the broker answered a fetch, and before the worker read the answer,
    # is in no response yet: the frontier must not pass its time, or a tick would not wait for it.
    tp = TP("timer-request", 0)
    written: list[int] = []
    responded: list[bool] = []

    async def check() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        consumer.assign([TopicPartition(tp.topic, tp.partition)])
        assignment = consumer._subscription.subscription.assignment
        state = assignment.state_value(TopicPartition(tp.topic, tp.partition))
        state.seek(5)

        async def answer(assignment: Any, node_id: int, request: Any) -> bool:
            """aiokafka's: the broker answers (nothing past offset 5), then the worker reads it."""
            await asyncio.sleep(0.02)  # on its way to the broker and back
            state.highwater = 5
            await asyncio.sleep(0.02)  # the answer waits for the consumer's thread
            written.append(time.time_ns() // 1_000_000)  # the cancel, offset 5, in no response
            await asyncio.sleep(0.002)
            state.timestamp = time.time_ns() // 1_000_000  # aiokafka stamps the response as read
            return True

        consumer._fetcher = SimpleNamespace(_proc_fetch_request=answer)
        faust_adapter.stamp_fetch_requests(consumer, lambda: responded.append(True))
        request = SimpleNamespace(topics=[(tp.topic, [(tp.partition, 5, 1 << 20)])])
        assert await consumer._fetcher._proc_fetch_request(assignment, 0, request)
        faust_consumer = SimpleNamespace(_thread=SimpleNamespace(_consumer=consumer))
        position = faust_adapter.fetch_position(faust_consumer, tp)  # type: ignore[arg-type]
        backlog = RequestBacklog()
        backlog.taken_to({tp: 5})
        frontier_ms = backlog.frontier_ms(tp, position)
        [cancel_ms] = written
        assert frontier_ms < cancel_ms - 30, (frontier_ms, cancel_ms)
        assert responded == [True]  # the engine looks again
        consumer._fetcher = None
        await consumer.stop()

    asyncio.run(check())
