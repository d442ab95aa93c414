"""Each invariant of the checker fails on an engine broken on purpose, and holds on the real one.

A small hand-written schedule (timers, a cancel, a new version, ticks, a verify) runs clean on the
engine as it is (:func:`test_the_schedule_runs_clean_on_the_engine`); each other test breaks one
thing with ``monkeypatch`` and asserts the invariant that names it reports a violation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from futures.worker import changelog
from futures.worker.callbacks import Callback
from futures.worker.dispatch import Dispatcher, Sending
from futures.worker.fencing import OwnerFence
from futures.worker.firing import DueScan, Fired, Firing
from futures.worker.ingest import Ingest
from futures.worker.table import FIRED_PREFIX, PartitionTimers
from tests.simulation import worker as sim_worker
from tests.simulation.checker import Delivery, marked
from tests.simulation.faults import DEFAULT, Fault
from tests.simulation.run import Outcome, run_schedule
from tests.simulation.schedule import Advance, Cancel, Pause, Rebalance, Schedule, Slow, Step, Txn, Verify

#: No skew, so that any early callback is early by every clock.
FAULTS = DEFAULT - {Fault.CLOCK_SKEW}

STEPS: list[Step] = [
    Advance(1_000, 20, 1),
    *(Schedule(n, n + 1, 2_000 + 300 * n, 1) for n in range(8)),
    Cancel(1, 100),
    Schedule(2, 101, 6_000),
    Advance(1_500, 20, 2),
    Verify(),
    Advance(8_000, 20, 3),
    Verify(),
]


def run(steps: list[Step] = STEPS, faults: frozenset[Fault] = FAULTS) -> Outcome:
    return run_schedule(steps, faults, seed=7)


def test_the_schedule_runs_clean_on_the_engine() -> None:
    outcome = run()
    assert outcome.violations == []
    assert outcome.callbacks == 7  # eight timers, one cancelled, one replaced


def test_a_firing_ahead_of_the_clock_is_early(monkeypatch: pytest.MonkeyPatch) -> None:
    def ahead(self: Firing, partition: int, second: int, fired: Fired) -> DueScan:
        fired.limits[partition] = limit_ms = second * 1000 + 2_000  # scans two seconds past the tick
        return DueScan(partition, self._ctx.tables(partition), limit_ms)

    monkeypatch.setattr(Firing, "_scan", ahead)
    assert "early_beyond_tolerance" in run().kinds()


def test_a_firing_ahead_within_the_tolerance_is_early_by_the_oscillators_clocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def ahead(self: Firing, partition: int, second: int, fired: Fired) -> DueScan:
        fired.limits[partition] = limit_ms = second * 1000 + 300
        return DueScan(partition, self._ctx.tables(partition), limit_ms)

    monkeypatch.setattr(Firing, "_scan", ahead)
    kinds = run().kinds()
    assert "early" in kinds
    assert "early_beyond_tolerance" not in kinds


def test_a_dropped_cancel_fires_what_it_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ingest, "_cancel", lambda self, request, part: None)
    assert "superseded_fired" in run().kinds()


def test_requests_skipped_are_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    accept = Ingest.accept

    async def skipping(self: Ingest, records: list[sim_worker.SourceRecord]) -> None:
        await accept(self, [r for r in records if r.offset % 2 == 0])

    async def no_gaps(self: object, topic: str, partition: int, start: int, end: int) -> list[object]:
        return []

    monkeypatch.setattr(Ingest, "accept", skipping)
    monkeypatch.setattr(sim_worker.SimGaps, "read", no_gaps)
    assert "lost" in run().kinds()


def test_fired_timers_kept_in_the_live_table_differ_from_a_restore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    apply = PartitionTimers.apply

    def keep_fired(
        self: PartitionTimers, records: list[tuple[bytes, bytes | None]], *args: object, **kwargs: object
    ) -> None:
        live = args[1] is not None if len(args) > 1 else kwargs.get("pending_delta") is not None
        if live:
            records = [r for r in records if not r[0].startswith(FIRED_PREFIX)]
        apply(self, records, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PartitionTimers, "apply", keep_fired)
    kinds = run().kinds()
    assert {"restore_differs", "pending_left"} <= kinds


def test_a_callback_sent_twice_without_a_crash_is_a_duplicate(monkeypatch: pytest.MonkeyPatch) -> None:
    send = Dispatcher.send

    def twice(
        self: Dispatcher, callbacks: Iterable[Callback], fired_ms: int, *args: Any, **kwargs: Any
    ) -> Sending:
        callbacks = list(callbacks)
        send(self, callbacks, fired_ms, *args, **kwargs)
        return send(self, callbacks, fired_ms, *args, **kwargs)

    monkeypatch.setattr(Dispatcher, "send", twice)
    assert "duplicate" in run().kinds()


def test_a_pending_count_off_by_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    apply = PartitionTimers.apply

    def miscount(
        self: PartitionTimers,
        records: list[tuple[bytes, bytes | None]],
        offset: int | None,
        pending_delta: int | None = None,
        *args: object,
        **kwargs: object,
    ) -> None:
        apply(self, records, offset, None if pending_delta is None else pending_delta + 1, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PartitionTimers, "apply", miscount)
    assert {"pending_count", "pending_left"} <= run().kinds()


def test_an_aborted_request_applied_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_worker, "READ_COMMITTED", False)  # the consumer reads aborted records
    steps: list[Step] = [Advance(1_000, 20, 1), Schedule(0, 1, 2_000, 1, Txn.ABORT), Advance(5_000, 20, 2)]
    assert "aborted_applied" in run(steps, FAULTS | {Fault.ABORTED_TXN}).kinds()


def test_a_callback_without_its_id_is_unmarked() -> None:
    sent = [Delivery("t1", 1, "t1", 0, "w0", 0, 0), Delivery("t2", 2, "", 0, "w0", 0, 0)]
    assert [v.invariant for v in marked(sent)] == ["unmarked"]


def test_a_worker_that_stops_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    async def choke(self: Firing, targets: dict[int, int], join: object = None) -> dict[int, int]:
        raise ValueError("a record the worker cannot build")

    monkeypatch.setattr(Firing, "fire", choke)
    assert "worker_stopped" in run().kinds()


#: w1's broker slows past the settle time, then p1 goes to w0: w1's progress record of p1, in flight,
#: lands after w0's owner record (found by seed 5009).
LATE_PROGRESS: list[Step] = [
    Slow(1, 15_649, 13_039),
    Advance(700, 60, 2627704842),
    Advance(700, 5, 3357299646),
    Rebalance((2, 0, 1, 2), eager=False),
    Verify(),
]


def test_a_revoked_owners_late_write_is_fenced_from_a_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    fenced = run_schedule(LATE_PROGRESS, DEFAULT, seed=5009)
    assert fenced.violations == [] and fenced.injected["fenced_records"] > 0
    monkeypatch.setattr(OwnerFence, "admit", lambda self, key, headers: True)
    assert "restore_differs" in run_schedule(LATE_PROGRESS, DEFAULT, seed=5009).kinds()


#: A paused owner's late put of a timer its successor also read, then time enough for
#: compaction to reach it (the changelog's min.compaction.lag.ms), and a restore.
LATE_PUT_COMPACTED: list[Step] = [
    Pause(2, 12_000, 2_000),
    Schedule(2, 1, 300_000),
    Advance(3_000, 50, 1),
    Advance(75_000, 500, 2),
    Verify(),
]


def test_a_key_a_fenced_owner_wrote_last_is_restated_before_compaction_reaches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome = run_schedule(LATE_PUT_COMPACTED, DEFAULT, seed=7)
    assert outcome.violations == [] and outcome.injected["restated"] > 0
    monkeypatch.setattr(changelog, "restatement", lambda table, keys: [])
    assert "restore_differs" in run_schedule(LATE_PUT_COMPACTED, DEFAULT, seed=7).kinds()
