"""Precise windows end with their partition and with their worker: a revoked partition sends
nothing more, a failed settle stops the worker. The clock is the test's: a window sends what
is due by it and otherwise waits, a few milliseconds at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from futures.worker.callbacks import Callback
from futures.worker.config import WorkerConfig
from futures.worker.prepare import prepare
from futures.worker.table import table_key
from futures.worker.windows import Item, Window, Windows
from ktimers.config import CommonConfig, KafkaConfig
from ktimers.errors import DeliveryError
from ktimers.wire import Future, StoredTimer
from tests.worker.fakes import transient_error
from tests.worker.rig import Kind, Rig, T

#: A second's start, on the test's clock, in milliseconds: window T holds (START, START + 1000].
START = (T - 1) * 1000


class OwnerRig(Rig):
    """A rig whose engine reports failures that must stop the worker to ``fatal``, and
    whose partitions are revoked the way the store revokes them (:meth:`revoke`)."""

    def __init__(self, directory: Path, config: WorkerConfig) -> None:
        super().__init__(directory, config)
        self.fatal: list[BaseException] = []
        self.engine.on_fatal = self.fatal.append

    def revoke(self, partition: int) -> None:
        self.owned.discard(partition)
        self.engine.revoke({partition})

    def produced(self, partition: int | None = None) -> list[str]:
        """Ids of the callbacks produced so far (delivered or not), in order."""
        return [
            (s.header("kt-id") or b"").decode()
            for s in self.producer.sent
            if s.topic == "orders" and (partition is None or s.key == f"p{partition}".encode())
        ]

    async def schedule(self, due: dict[str, int], partition: int = 0) -> None:
        await self.engine.ingest(
            [self.request(i, d, key=f"p{partition}", partition=partition) for i, d in due.items()]
        )


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Callable[[], OwnerRig]]:
    rigs: list[OwnerRig] = []

    def make() -> OwnerRig:
        config = WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True)
        rig = OwnerRig(tmp_path / f"rig{len(rigs)}", config)
        rig.now = START + 10
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


async def _until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not check():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.005)


def test_a_revoked_partition_sends_nothing_more_settles_what_it_sent_and_leaves_the_rest(
    owner: Callable[[], OwnerRig],
) -> None:
    rig = owner()
    engine = rig.engine
    due = {f"t{i}": START + 100 + 10 * i for i in range(10)}
    other = {f"o{i}": START + 100 + 10 * i for i in range(10)}

    async def scenario() -> None:
        await rig.schedule(due, partition=0)
        await rig.schedule(other, partition=1)
        await rig.fire([rig.tick_record(T - 1, p) for p in (0, 1)])  # opens windows T and T + 1
        rig.now = START + 145  # t0..t4 are due
        await _until(lambda: len(rig.produced(0)) == 5)
        rig.revoke(0)
        await engine.settle_revoked()  # as the rebalance does, before the group rejoins
        rig.now = T * 1000 + 10  # the rest of the window is due
        await _until(lambda: len(rig.produced(1)) == 10)  # the partition kept sends on
        await rig.fire([rig.tick_record(T, 1)])
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert rig.produced(0) == ["t0", "t1", "t2", "t3", "t4"]
    # What it sent is deleted through the changelog, so the new owner, which rebuilds the table
    # from it, does not send them again; what it did not send is left to the new owner.
    assert sorted(rig.pending_ids(0)) == ["t5", "t6", "t7", "t8", "t9"]
    assert len(rig.deletions(0, delivered_only=True)) == 5
    assert rig.produced(1) == list(other)
    assert rig.pending_ids(1) == []
    assert rig.fatal == []


def test_a_revoked_window_that_cannot_settle_in_time_leaves_what_it_sent_to_the_new_owner(
    tmp_path: Path,
) -> None:
    # A third of the rebalance timeout: the group must not drop this worker while it settles.
    config = WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True, rebalance_timeout_s=0.3)
    rig = OwnerRig(tmp_path, config)
    rig.now = START + 10
    due = {f"t{i}": START + 100 + 10 * i for i in range(10)}

    async def scenario() -> float:
        await rig.schedule(due)
        await rig.fire([rig.tick_record(T - 1)])
        rig.producer.hold = True  # the broker stops answering
        rig.now = START + 145
        await _until(lambda: len(rig.produced()) == 5)
        rig.revoke(0)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await rig.engine.settle_revoked()
        took = loop.time() - began
        rig.producer.hold = False  # it answers once the new owner has the partition
        await asyncio.sleep(0.05)
        return took

    try:
        took = asyncio.run(scenario())
        assert took < 0.3, f"settling the revoked window took {took:.2f}s"
        assert rig.produced() == ["t0", "t1", "t2", "t3", "t4"]
        # Given up on: nothing deleted here or in the changelog, so the new owner sends all ten.
        assert sorted(rig.pending_ids()) == sorted(due)
        assert rig.deletions(0) == []
        assert rig.fatal == []
    finally:
        rig.close()


def test_a_cancel_applied_by_the_new_owner_is_not_defeated_by_the_old_one(
    owner: Callable[[], OwnerRig],
) -> None:
    old, new = owner(), owner()

    async def scenario() -> None:
        for rig in (old, new):  # the new owner rebuilt the same table from the changelog
            await rig.schedule({"x": START + 500, "y": START + 600})
            await rig.fire([rig.tick_record(T - 1)])
        old.revoke(0)  # the rebalance: revoked here before the new owner is assigned it
        await new.engine.ingest([new.cancel("x")])
        for rig in (old, new):
            rig.now = T * 1000 + 10
        await _until(lambda: new.produced() == ["y"])
        await new.fire([new.tick_record(T)])
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert [e.id for e in new.events(Kind.CANCELLED)] == ["x"]
    assert old.produced() == []
    assert new.produced() == ["y"]


def test_a_failed_settle_stops_the_worker_and_its_timers_are_not_sent_again(
    owner: Callable[[], OwnerRig],
) -> None:
    rig = owner()
    changelog = rig.config.changelog_topic
    due = {f"t{i}": START + 100 + 10 * i for i in range(5)}

    async def scenario() -> None:
        await rig.schedule(due)
        await rig.fire([rig.tick_record(T - 1)])
        await rig.schedule({"next": T * 1000 + 100})  # window T + 1's
        rig.producer.fail = lambda topic: transient_error() if topic == changelog else None
        rig.now = T * 1000 + 10
        await _until(lambda: bool(rig.fatal))
        rig.producer.fail = lambda topic: None  # the broker is back: nothing must go out again
        rig.now = T * 1000 + 200
        await rig.fire([rig.tick_record(T)])
        await asyncio.sleep(0.05)
        await rig.fire([rig.tick_record(T + 1)])

    asyncio.run(scenario())
    [failure] = rig.fatal
    assert isinstance(failure, DeliveryError)
    assert rig.produced() == list(due)  # once each: "next" neither, the worker stops
    assert sorted(rig.pending_ids()) == sorted([*due, "next"])  # a restart sends them


def test_what_was_prepared_ahead_for_a_revoked_partition_is_dropped_at_once(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.ingest(
        rig.request("mine", T * 1000 + 500, partition=0), rig.request("theirs", T * 1000 + 500, partition=1)
    )
    rig.now = T * 1000 + 10

    async def scenario() -> None:
        await rig.fire([rig.tick_record(T, p) for p in (0, 1)])
        await rig.between_ticks()
        assert len(rig.engine._lookahead) == 2
        rig.owned.discard(1)
        rig.engine.revoke({1})
        assert len(rig.engine._lookahead) == 1

    asyncio.run(scenario())


def test_a_revoked_window_wakes_and_ends_and_a_failed_one_is_reported() -> None:
    failures: list[BaseException] = []
    windows = Windows(1 << 20, failures.append)

    async def wait_long(window: Window) -> None:
        try:
            while not window.revoked:
                await window.wait(60)
        finally:
            windows.close(window)

    async def fail(window: Window) -> None:
        windows.close(window)
        raise DeliveryError("changelog record(s) not delivered")

    async def scenario() -> None:
        windows.open(windows.new(0, T), wait_long)
        windows.open(windows.new(1, T), wait_long)
        windows.revoke({0})
        assert windows.partitions() == {1}
        await asyncio.sleep(0.01)
        waiting = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        assert len(waiting) == 1, "the revoked window still waits"
        windows.open(windows.new(2, T), fail)
        await asyncio.wait_for(windows.done({2: T}), 1)  # waits for it to end, does not raise
        windows.revoke({1})
        await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert [str(f) for f in failures] == ["changelog record(s) not delivered"]


def test_a_second_larger_than_the_budget_is_read_on_as_it_sends_and_cancels_still_win(
    tmp_path: Path,
) -> None:
    # The windows' three quarters of the smallest budget hold about eight callbacks of 100 KB.
    config = WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True, fire_budget_bytes=1 << 20)
    rig = OwnerRig(tmp_path, config)
    rig.now = START + 10
    big = b"x" * 100_000
    due = {f"a{i}": START + 100 + 80 * i for i in range(10)}

    async def scenario() -> None:
        await rig.engine.ingest([rig.request(t, d, payload=big) for t, d in due.items()])
        await rig.fire([rig.tick_record(T - 1)])  # opens window T: it holds a0..a7
        window = rig.engine._precise.windows._open[(0, T)]  # type: ignore[union-attr]
        assert not window.complete
        await rig.engine.ingest(
            [
                rig.request("early", START + 50, payload=big),  # no room: taken without its callback
                rig.request("late", START + 900),
                rig.cancel("a9"),  # not read yet: the window must not send it when it reads it
            ]
        )
        assert len(window.deferred) == 2 and len(window.held) == 10  # a0..a7 read; "early", "late" deferred
        assert table_key(due["a9"], "a9") in window.removed  # not read yet: marked for when it is
        for step in range(START + 50, START + 1010, 10):
            rig.now = step
            await asyncio.sleep(0.003)
        await _until(lambda: len(rig.produced()) == 11)
        await rig.fire([rig.tick_record(T)])

    try:
        asyncio.run(scenario())
        assert rig.produced() == ["early", *(f"a{i}" for i in range(9)), "late"]
        fired = {
            (s.header("kt-id") or b"").decode(): int(s.header("kt-fired-ms") or 0)
            for s in rig.producer.sent
            if s.topic == "orders"
        }
        assert all(
            fired[t] >= d for t, d in {**due, "early": START + 50, "late": START + 900}.items() if t != "a9"
        )
        assert rig.pending_ids(0) == []
        assert rig.engine._precise.windows.gauge.used == 0  # type: ignore[union-attr]
        assert rig.fatal == []
    finally:
        rig.close()


def test_a_window_hands_out_the_timers_due_by_now_in_due_order_and_never_one_due_later() -> None:
    windows = Windows(1 << 20, lambda exc: None)
    window = windows.new(0, T)

    def timer(timer_id: str, due_ms: int) -> Item:
        key = table_key(due_ms, timer_id)
        future = Future(callBackTopic="orders", callBackKey="k", id=timer_id, due_ms=due_ms)
        return due_ms, key, prepare(key, 0, StoredTimer(future=future).SerializeToString())

    for timer_id, due_ms in [("c", START + 30), ("a", START + 10), ("later", START + 500), ("b", START + 20)]:
        window.add(timer(timer_id, due_ms))
    window.removed.add(table_key(START + 20, "b"))  # cancelled meanwhile

    def no_table(key: bytes) -> Callback | None:
        raise AssertionError("nothing was deferred")

    assert [c.timer_id for c in window.pop_due(START + 5, no_table, 10)] == []
    assert [c.timer_id for c in window.pop_due(START + 30, no_table, 1)] == ["a"]
    assert [c.timer_id for c in window.pop_due(START + 30, no_table, 10)] == ["c"]  # b left out
    assert window.next_due() == START + 500
