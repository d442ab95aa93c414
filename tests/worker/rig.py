"""The engine rig: a real :class:`TimerEngine` on RocksDB tables under ``tmp_path``,
a :class:`FakeProducer` and a clock the test moves. Fixtures ``make_rig`` and ``rig``
are registered in tests/worker/conftest.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import TimerEngine
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.table import FIRED_PREFIX, TIMER_PREFIX, PartitionTimers, unpack_keys
from ktimers.config import BrokerProfile, CommonConfig, KafkaConfig
from ktimers.wire import Cancel, Future, Header, Tick, TimerEvent, encode_second_key
from tests.worker.fakes import FakeProducer, FakeTopics, Sent

T = 1_795_000_000  # an epoch second
#: Event loop turns a test gives the engine's background tasks between two ticks: more than
#: building the callbacks of the few hundred timers a test holds takes.
BETWEEN_TICKS_TURNS = 200
T_MS = T * 1000
Kind = TimerEvent.Kind


class FakeFrontier:
    """Per partition, the epoch ms before which every request is applied (absent: all are)."""

    def __init__(self) -> None:
        self.behind: dict[int, int] = {}

    def frontier_ms(self, partition: int) -> int | None:
        return self.behind.get(partition)


class Rig:
    """One engine, its tables, a fake producer and a hand-moved clock."""

    def __init__(self, directory: Path, config: WorkerConfig) -> None:
        self.config = config
        self.topics = config.common.topics
        self.now = T_MS - 60_000
        self.directory = directory
        self.producer = FakeProducer(max_bytes=config.max_record_bytes)
        self.producer.clock = lambda: self.now
        self.callback_topics = FakeTopics()
        self.metrics = WorkerMetrics()
        self.tables: dict[int, PartitionTimers] = {}
        self._offsets: dict[tuple[str, int], int] = defaultdict(int)
        #: Partitions this worker is assigned (a rebalance changes it).
        self.owned = {0, 1, 2, 3}
        #: What the consumer would say of requests fetched and not yet applied.
        self.frontier = FakeFrontier()
        #: The engine lock: a test holds it to stand for an ingest step under way.
        self.lock = asyncio.Lock()
        self.engine = TimerEngine(
            config,
            self.table,
            KafkaWriter(self.producer, config.max_record_bytes),
            self.metrics,
            clock=lambda: self.now,
            owns=lambda partition: partition in self.owned,
            callback_topics=self.callback_topics,
            frontier=self.frontier,
            lock=self.lock,
        )

    def table(self, partition: int) -> PartitionTimers:
        if partition not in self.tables:
            self.tables[partition] = PartitionTimers(self.directory / f"p{partition}.db")
        return self.tables[partition]

    def close(self) -> None:
        """Close the tables (a worker that stops); once, however often called."""
        tables, self.tables = list(self.tables.values()), {}
        for table in tables:
            table.close()

    # -- input records ------------------------------------------------------

    def _record(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes | None], ...] = (),
    ) -> SourceRecord:
        offset = self._offsets[(topic, partition)]
        self._offsets[(topic, partition)] += 1
        return SourceRecord(topic, partition, offset, key, value, headers)

    def request(
        self,
        timer_id: str,
        due_ms: int,
        *,
        topic: str = "orders",
        key: str = "",
        payload: bytes | None = None,
        token: str = "",
        headers: tuple[tuple[str, bytes], ...] = (),
        partition: int = 0,
    ) -> SourceRecord:
        future = Future(
            callBackTopic=topic,
            callBackKey=key or f"key-{timer_id}",
            callBack=payload if payload is not None else timer_id.encode(),
            id=timer_id,
            due_ms=due_ms,
            token=token,
            headers=[Header(key=k, value=v) for k, v in headers],
        )
        return self._record(self.topics.request, partition, None, future.SerializeToString())

    def raw_request(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes | None], ...] = (),
        partition: int = 0,
    ) -> SourceRecord:
        return self._record(self.topics.request, partition, key, value, headers)

    def cancel(self, timer_id: str, partition: int = 0) -> SourceRecord:
        value = Cancel(id=timer_id).SerializeToString()
        return self._record(self.topics.request, partition, None, value, (("kt-kind", b"cancel"),))

    def follows(self, other: Rig) -> None:
        """This worker now reads the topics ``other`` read: its records come after ``other``'s (a
        partition's next owner)."""
        for where, offset in other._offsets.items():
            self._offsets[where] = max(self._offsets[where], offset)

    def last_offset(self, topic: str, partition: int) -> int:
        """Offset of the last record made for ``topic`` and ``partition`` (-1 if none)."""
        return self._offsets[(topic, partition)] - 1

    def tick_record(self, second: int, partition: int = 0, source: str = "osc-a") -> SourceRecord:
        value = Tick(second=second, source=source, emitted_ms=second * 1000).SerializeToString()
        return self._record(self.topics.oscillator, partition, encode_second_key(second), value)

    # -- driving the engine -------------------------------------------------

    async def _landed_after(self, step: Awaitable[None]) -> None:
        """``step``, then its progress records landed (the engine's firing task does not wait)."""
        await step
        await self.engine.landed()

    def ingest(self, *records: SourceRecord) -> None:
        asyncio.run(self._landed_after(self.engine.ingest(records)))
        assert len(self.producer) == 0, "ingest returned before every record was delivered"

    def tick(self, second: int, *, partitions: tuple[int, ...] = (0,), clock_ms: int | None = None) -> None:
        """Every partition's clock reaches ``second``; by default our clock just passed it too."""
        self.now = clock_ms if clock_ms is not None else max(self.now, second * 1000 + 10)
        self.advance([self.tick_record(second, p) for p in partitions])

    def fire_ready(self) -> None:
        """What the engine's firing task does first in each turn: fire what the waiting ticks allow."""
        asyncio.run(self._landed_after(self.engine.fire_ready()))
        assert len(self.producer) == 0, "fire_ready returned before every record was delivered"

    def advance(self, ticks: list[SourceRecord]) -> None:
        asyncio.run(self.fire(ticks))
        assert len(self.producer) == 0, "the firing returned before every record was delivered"

    async def fire(self, ticks: list[SourceRecord]) -> None:
        """What the consumer does with fetched ticks (the engine takes them), then the firing part
        of the firing task's turn (:meth:`TimerEngine.turn`, whose sweep step :meth:`sweep` runs);
        durable, progress records too, when this returns."""
        self.engine.note_ticks(ticks)
        await self.engine.fire_ready()
        await self.engine.landed()

    async def sweep(self) -> None:
        """The firing task's turns while no tick waits: every fired timer's own tombstone written."""
        while await self.engine.turn():
            pass
        await self.engine.landed()

    async def between_ticks(self) -> None:
        """The wait for the next tick, in which the engine's other tasks run (the next second's
        callbacks are built ahead): the event loop turns until they are done."""
        for _ in range(BETWEEN_TICKS_TURNS):
            await asyncio.sleep(0)

    # -- what came out ------------------------------------------------------

    def callbacks(self, topic: str = "orders") -> list[Sent]:
        return self.producer.on(topic)

    def fired(self, topic: str = "orders") -> list[str]:
        return [(cb.header("kt-id") or b"").decode() for cb in self.callbacks(topic)]

    def dlq(self) -> list[Sent]:
        return self.producer.on(self.topics.dlq)

    def events(self, kind: int | None = None) -> list[TimerEvent]:
        return [e for e in self.producer.events(self.topics.events) if kind is None or e.kind == kind]

    def changelog(self, partition: int = 0) -> list[Sent]:
        return [s for s in self.producer.on(self.config.changelog_topic) if s.partition == partition]

    def deletions(self, partition: int = 0, delivered_only: bool = False) -> list[tuple[bytes, Sent]]:
        """Each timer deleted through the changelog: (its table key, the record that deleted it —
        its tombstone, or the ``f`` record that lists it)."""
        found: list[tuple[bytes, Sent]] = []
        for sent in self.changelog(partition):
            key = sent.key or b""
            if delivered_only and not sent.delivered:
                continue
            if key.startswith(TIMER_PREFIX) and sent.value is None:
                found.append((key, sent))
            elif key.startswith(FIRED_PREFIX) and sent.value is not None:
                found.extend((listed, sent) for listed in unpack_keys(sent.value))
        return found

    def pending_ids(self, partition: int = 0) -> list[str]:
        return [d.timer_id for d in self.table(partition).iter_pending()]

    def ticks_counted(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value("timers_ticks_total", {"outcome": outcome})
        return value or 0.0


MakeRig = Callable[..., Rig]


def new_rig(directory: Path, profile: BrokerProfile = BrokerProfile.CLUSTER, **settings: object) -> Rig:
    """A rig on fresh tables under ``directory``, its worker configured with ``settings``."""
    common = CommonConfig(kafka=KafkaConfig(profile=profile))
    return Rig(directory, WorkerConfig(common=common, **settings))  # type: ignore[arg-type]


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[MakeRig]:
    rigs: list[Rig] = []

    def make(profile: BrokerProfile = BrokerProfile.CLUSTER, **settings: object) -> Rig:
        rig = new_rig(tmp_path / f"rig{len(rigs)}", profile, **settings)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


@pytest.fixture
def rig(make_rig: MakeRig) -> Rig:
    return make_rig()
