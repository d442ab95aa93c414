"""End to end on the embedded broker: a real worker fires some timers; compact; replay elsewhere.

One scenario, built once for the module: timers scheduled through the client,
some fired by the worker, some cancelled, some rescheduled, the rest still
pending when the oscillator stops.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from futures.jobs.compact import CompactOptions
from futures.jobs.compact import run as compact
from futures.jobs.config import JobConfig
from futures.jobs.errors import SnapshotError
from futures.jobs.replay import ReplayOptions
from futures.jobs.replay import run as replay
from ktimers.wire import H_DUE_MS, TimerEvent, header_value
from tests.integration.conftest import Callback, Stack, TopicReader, fresh_env
from tests.processes import Service

pytestmark = pytest.mark.integration

FIRE, CANCEL, KEEP, RESCHEDULE = 5, 4, 5, 3
#: Delay (s) of the timers that must still be pending when the oscillator stops; due by the time
#: the new worker starts, so they fire on its first tick.
LATER_S = 15


@dataclass
class Scenario:
    stack: Stack
    callbacks: TopicReader
    t0_ms: int
    fired: set[str]
    kept: set[str]  # pending, scheduled once
    rescheduled: set[str]  # pending, second version
    cancelled: set[str]
    snapshot: Path

    @property
    def config(self) -> JobConfig:
        return JobConfig.from_env(self.stack.env)


def stack_with(broker_env: dict[str, str], tmp: Path) -> Stack:
    """A fresh topic set whose services log under ``tmp`` (the ``spawn`` fixture is per test)."""

    def spawn(name: str, args: list[str], env: dict[str, str], start: bool = True) -> Service:
        service = Service(name, [sys.executable, *args], env, tmp / f"{name}-{uuid.uuid4().hex[:6]}.log")
        return service.start() if start else service

    return Stack(env=fresh_env(broker_env), spawn=spawn, data_dir=tmp / "worker-data")


def stop(stack: Stack) -> None:
    for service in [*stack.oscillators, *([stack.worker] if stack.worker else [])]:
        service.stop(timeout_s=10)
    stack.close()


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def scenario(
    broker_env: dict[str, str], spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    tmp = tmp_path_factory.mktemp("scenario")
    stack = stack_with(broker_env, tmp)
    try:
        stack.start_worker()
        osc = stack.start_oscillator()
        callbacks = stack.callback_topic("jobs")
        t0 = time.time_ns() // 1_000_000
        fired, kept, rescheduled, cancelled = set(), set(), set(), set()
        with stack.client() as client:
            for i in range(FIRE):
                fired.add(client.schedule(callbacks.topic, f"f{i}", b"fire", delay=2, id=f"fire-{i}").id)
            for i in range(KEEP):
                kept.add(client.schedule(callbacks.topic, f"k{i}", b"keep", delay=LATER_S, id=f"keep-{i}").id)
            for i in range(RESCHEDULE):
                client.schedule(callbacks.topic, f"r{i}", b"v1", delay=2, id=f"re-{i}")
                rescheduled.add(
                    client.schedule(callbacks.topic, f"r{i}", b"v2", delay=LATER_S, id=f"re-{i}").id
                )
            handles = [
                client.schedule(callbacks.topic, f"c{i}", b"no", delay=LATER_S, id=f"cancel-{i}")
                for i in range(CANCEL)
            ]
            client.flush()
            for handle in handles:
                client.cancel(handle)
                cancelled.add(handle.id)
        callbacks.read_until(lambda r: len(r) >= FIRE, timeout_s=20)

        def fired_events() -> int:
            return sum(1 for e in stack.events() if e.kind == TimerEvent.Kind.FIRED)

        wait_for(lambda: fired_events() >= FIRE, 15, "FIRED events")
        osc.stop()  # the clock stops: nothing else fires here
        assert time.time_ns() // 1_000_000 < t0 + (LATER_S - 2) * 1000, (
            "too slow: the kept timers may have fired"
        )
        stack.worker.stop()
        assert {c.timer_id for c in callbacks.records} == fired
        snapshot = tmp / "snapshot"
        result = compact(spark, JobConfig.from_env(stack.env), CompactOptions(out=str(snapshot)))
        counts = result.counts
        assert (counts.fired, counts.cancelled, counts.superseded, counts.pending) == (
            FIRE, CANCEL, RESCHEDULE, KEEP + RESCHEDULE
        )  # fmt: skip
        yield Scenario(stack, callbacks, t0, fired, kept, rescheduled, cancelled, snapshot)
    finally:
        stop(stack)


def new_callbacks(reader: TopicReader, since: int, settle_s: float = 1.5) -> list[Callback]:
    reader.poll(settle_s)
    return reader.records[since:]


def test_replayed_snapshot_fires_exactly_the_pending_timers_once(
    scenario: Scenario, spark: SparkSession, broker_env: dict[str, str], tmp_path: Path
) -> None:
    # A brand-new topic set and worker, as after losing a cluster's state.
    fresh = stack_with(broker_env, tmp_path)
    try:
        target = JobConfig.from_env(fresh.env)
        first = replay(spark, target, ReplayOptions(snapshot=str(scenario.snapshot)))
        again = replay(spark, target, ReplayOptions(snapshot=str(scenario.snapshot)))
        assert first.records == again.records == KEEP + RESCHEDULE
        assert first.keep_partitions
        before = len(scenario.callbacks.records)
        fresh.start_worker()
        fresh.start_oscillator()
        pending = scenario.kept | scenario.rescheduled
        scenario.callbacks.read_until(lambda r: len(r) >= before + len(pending), timeout_s=30)
        arrived = new_callbacks(scenario.callbacks, before)
        ids = sorted(c.timer_id for c in arrived)
        assert ids == sorted(pending)  # each pending timer once; nothing fired, cancelled or superseded
        assert {c.value for c in arrived if c.timer_id in scenario.rescheduled} == {b"v2"}
    finally:
        stop(fresh)


def test_due_range_replay_sends_exactly_the_callbacks_due_in_the_window(
    scenario: Scenario, spark: SparkSession
) -> None:
    window = ReplayOptions(
        due_from_ms=scenario.t0_ms + 1_000,
        due_to_ms=scenario.t0_ms + 5_000,
        to_topic=scenario.callbacks.topic,
    )
    before = len(scenario.callbacks.records)
    dry = replay(spark, scenario.config, ReplayOptions(**{**window.__dict__, "dry_run": True}))
    assert (dry.records, dry.dry_run) == (FIRE, True)
    assert new_callbacks(scenario.callbacks, before, settle_s=0.5) == []

    result = replay(spark, scenario.config, window)
    assert result.records == FIRE
    scenario.callbacks.read_until(lambda r: len(r) >= before + FIRE, timeout_s=15)
    resent = new_callbacks(scenario.callbacks, before)
    # The fired ones, as the worker sent them; not the superseded first versions due in the same window.
    assert sorted(c.timer_id for c in resent) == sorted(scenario.fired)
    assert {(c.key, c.value) for c in resent} == {(f"f{i}".encode(), b"fire") for i in range(FIRE)}
    for c in resent:
        due = int(header_value(c.headers, H_DUE_MS) or 0)
        assert scenario.t0_ms + 1_000 <= due < scenario.t0_ms + 5_000


def test_snapshot_for_another_partition_count_is_refused_unless_forced(
    scenario: Scenario, spark: SparkSession, broker_env: dict[str, str]
) -> None:
    two = JobConfig.from_env(fresh_env(broker_env, partitions=2))
    with pytest.raises(SnapshotError, match="covers 4 partitions .* has 2.*--force"):
        replay(spark, two, ReplayOptions(snapshot=str(scenario.snapshot), dry_run=True))
    forced = replay(spark, two, ReplayOptions(snapshot=str(scenario.snapshot), dry_run=True, force=True))
    assert (forced.records, forced.keep_partitions) == (KEEP + RESCHEDULE, False)


def test_incomplete_snapshot_is_refused(scenario: Scenario, spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "half" / "timers").mkdir(parents=True)
    with pytest.raises(SnapshotError, match="no snapshot manifest"):
        replay(spark, scenario.config, ReplayOptions(snapshot=str(tmp_path / "half")))
