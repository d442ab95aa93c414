"""Precise mode through rebalances: a worker joins, then leaves, while windows are sending."""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import pytest

from futures.client import TimerHandle
from ktimers.wire import TimerEvent
from tests.integration.conftest import Callback, Stack
from tests.integration.test_join import timer_events
from tests.integration.test_scaling import start_second_worker, wait_until_partitions_split
from tests.processes import Service

pytestmark = pytest.mark.integration

Kind = TimerEvent.Kind

#: Timers due over SPAN_S seconds, starting START_S seconds after they are scheduled.
TIMERS, START_S, SPAN_S = 2400, 4.0, 20.0
#: Every CANCEL_EVERY-th timer due at least CANCEL_FROM_S seconds after scheduling is cancelled,
#: CANCEL_AHEAD_S seconds before it is due (at least MIN_CANCEL_AHEAD_S).
CANCEL_EVERY, CANCEL_FROM_S, CANCEL_AHEAD_S, MIN_CANCEL_AHEAD_S = 4, 8.0, 6.0, 5.0
#: Log lines are stamped to the millisecond, truncated.
SLACK_MS = 5

#: A worker's log lines when its tables are ready to fire, and when a rebalance takes partitions away.
_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] .*"
HOLDS = re.compile(
    _STAMP + r"(?:timer table ready: partitions \[([\d, ]*)\]|partitions \[([\d, ]*)\] revoked)", re.M
)


@dataclass(frozen=True)
class Held:
    """A partition held by a worker: from when its table was ready to fire until it was revoked
    (or the worker exited), host clock, epoch ms."""

    worker: str
    partition: int
    start_ms: int
    end_ms: int


def holdings(worker: Service, exit_ms: int) -> list[Held]:
    """What ``worker``'s log says it held, and when (its log lines' local time stamps)."""
    held: list[Held] = []
    since: dict[int, int] = {}
    for stamp, ready, revoked in HOLDS.findall(worker.output()):
        at_ms = round(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)  # noqa: DTZ007
        for partition in _partitions(ready):
            since.setdefault(partition, at_ms)
        for partition in _partitions(revoked):
            if partition in since:
                held.append(Held(worker.name, partition, since.pop(partition), at_ms))
    held.extend(Held(worker.name, partition, start, exit_ms) for partition, start in since.items())
    return held


def _partitions(listed: str) -> list[int]:
    return [int(p) for p in listed.split(",") if p.strip()]


class Holders:
    """Who held the partition of a callback when it was sent."""

    def __init__(self, held: list[Held], partition_of: dict[str, int]) -> None:
        self._held = held
        self._partition_of = partition_of

    def of(self, callback: Callback) -> Held | None:
        partition = self._partition_of[callback.timer_id]
        for h in self._held:
            if h.partition == partition and h.start_ms - SLACK_MS <= callback.fired_ms <= h.end_ms + SLACK_MS:
                return h
        return None


class Canceller(threading.Thread):
    """Cancels each of ``handles`` CANCEL_AHEAD_S before it is due, through its own client;
    records when each cancel was written (epoch ms, once flushed)."""

    def __init__(self, stack: Stack, handles: list[TimerHandle]) -> None:
        super().__init__(daemon=True)
        self._stack = stack
        self._todo = sorted(handles, key=lambda h: h.due_ms)
        self.written_ms: dict[str, int] = {}
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with self._stack.client() as client:
                while self._todo:
                    horizon = time.time_ns() // 1_000_000 + CANCEL_AHEAD_S * 1000
                    now_due = [h for h in self._todo if h.due_ms <= horizon]
                    if now_due:
                        self._todo = self._todo[len(now_due) :]
                        for handle in now_due:
                            client.cancel(handle)
                        client.flush(10)
                        written = time.time_ns() // 1_000_000
                        self.written_ms.update((h.id, written) for h in now_due)
                    time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc


def test_precise_windows_through_a_join_and_a_leave(stack: Stack) -> None:
    stack.env["TIMERS_PRECISE"] = "1"
    stack.start_worker()
    stack.start_oscillator()
    first = stack.worker
    assert first is not None
    reader = stack.callback_topic("precise-rebalance")

    scheduled = time.time()
    handles: list[TimerHandle] = []
    with stack.client() as client:
        for i in range(TIMERS):
            at = scheduled + START_S + SPAN_S * i / TIMERS
            handles.append(client.schedule(reader.topic, f"k{i}", f"v{i}", at=at, id=f"t{i}"))
    cancelled = [
        h
        for i, h in enumerate(handles)
        if i % CANCEL_EVERY == 1 and h.due_ms >= (scheduled + CANCEL_FROM_S) * 1000
    ]
    canceller = Canceller(stack, cancelled)
    canceller.start()

    # Once the first windows are sending, a second worker joins...
    time.sleep(max(scheduled + START_S - time.time(), 0))
    second, second_port = start_second_worker(stack)
    split = wait_until_partitions_split([stack.web_port, second_port], 4, timeout_s=30)
    joined_s = time.time() - scheduled
    assert all(split), f"one worker holds nothing: {split}"
    # ... and, a few seconds later, leaves while later windows are sending.
    time.sleep(3)
    assert second.stop() == 0
    left_ms = time.time_ns() // 1_000_000
    wait_until_partitions_split([stack.web_port], 4, timeout_s=30)
    left_s, settled_s = left_ms / 1000 - scheduled, time.time() - scheduled
    # The leave's rebalance may end after the last timer is due (a busy machine); what matters is
    # that windows were still to send when it began.
    assert left_s < START_S + SPAN_S - 3, f"the second worker left too late to be mid-window: {left_s:.1f}s"

    canceller.join(timeout=SPAN_S + 10)
    assert canceller.failure is None, f"cancelling failed: {canceller.failure!r}"
    due = {h.id: h.due_ms for h in handles}
    short = {i: due[i] - w for i, w in canceller.written_ms.items() if due[i] - w < MIN_CANCEL_AHEAD_S * 1000}
    assert not short, f"cancels written less than {MIN_CANCEL_AHEAD_S}s before due (ms before): {short}"
    expected = set(due) - {h.id for h in cancelled}
    reader.read_until(lambda r: {c.timer_id for c in r} >= expected, timeout_s=40)
    reader.poll(2.0)  # a cancelled timer or a late repeat would show up now

    copies: dict[str, list[Callback]] = defaultdict(list)
    for callback in reader.records:
        copies[callback.timer_id].append(callback)
    missing = expected - set(copies)
    assert not missing, f"{len(missing)} of {len(expected)} timers never fired, e.g. {sorted(missing)[:3]}"
    fired_cancelled = sorted({h.id for h in cancelled} & set(copies))
    assert not fired_cancelled, f"{len(fired_cancelled)} cancelled timers fired: {fired_cancelled[:5]}"
    early = [c for c in reader.records if min(c.received_ms, c.fired_ms) < due[c.timer_id]]
    assert not early, f"{len(early)} fired early, e.g. {early[0]}"
    # Every cancel was applied before its timer was sent.
    events = timer_events(stack, set(canceller.written_ms), until=2 * len(cancelled), timeout_s=20)
    outcomes = {e.id: e.kind for e in events if e.kind != Kind.SCHEDULED}
    assert all(outcomes.get(h.id) == Kind.CANCELLED for h in cancelled), {
        h.id: outcomes.get(h.id) for h in cancelled if outcomes.get(h.id) != Kind.CANCELLED
    }

    # A partition is sent from only while a worker holds it: nothing after its revocation.
    partition_of = {e.id: e.partition for e in timer_events(stack, set(due), until=len(due), timeout_s=20)}
    held = [*holdings(first, time.time_ns() // 1_000_000), *holdings(second, left_ms)]
    ends = sorted({round(h.end_ms / 1000 - scheduled, 2) for h in held})
    # Its tables ready, revoked at the join, ready, revoked at the leave, ready until now.
    assert len({h.end_ms for h in held if h.worker == first.name}) >= 3, f"the join and the leave: {held}"

    holders = Holders(held, partition_of)
    unheld = [c for c in reader.records if holders.of(c) is None]
    assert not unheld, (
        f"{len(unheld)} callbacks sent while no worker held their partition (revoked; ownership ended "
        f"at {ends}s), e.g. {[(c.timer_id, c.fired_ms / 1000 - scheduled) for c in unheld[:5]]}"
    )
    # A rebalance sends nothing twice: what a worker sent of a partition it loses is settled
    # (deleted through the changelog) before the group rejoins, so the new owner never has it.
    repeated = {
        i: sorted(round(c.fired_ms / 1000 - scheduled, 2) for c in cs)
        for i, cs in copies.items()
        if len(cs) > 1
    }
    late = sorted(c.fired_ms - due[c.timer_id] for c in reader.records)  # read after the fact: sent time
    print(
        f"\nprecise, {TIMERS} timers over {SPAN_S:.0f}s, {len(cancelled)} cancelled: second worker in at "
        f"{joined_s:.1f}s, out at {left_s:.1f}s (one worker again at {settled_s:.1f}s); partitions "
        f"held until {ends}s; {len(repeated)} timers fired more than once; "
        f"lateness p50 {late[len(late) // 2]} ms, p99 {late[len(late) * 99 // 100]} ms, max {late[-1]} ms"
    )
    assert not repeated, (
        f"{len(repeated)} timers fired more than once (id: sent at s), e.g. {sorted(repeated.items())[:5]}; "
        f"held: {held}"
    )
