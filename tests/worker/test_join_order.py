"""The join of requests and ticks, by property: whatever the order in which requests are
applied and ticks arrive, a timer never fires early, fires at most once, fires if nothing
replaced or cancelled it, and never fires when a cancel or a new version of it was written
before its due time.

The consumer is modelled as :mod:`futures.worker.join` sees it: requests are applied in the
order they were written, and a partition's frontier is the write time of the oldest request
not applied yet.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.worker.rig import T_MS, T, new_rig

IDS = ("a", "b", "c", "d")


@dataclass(frozen=True)
class Op:
    written_ms: int
    timer_id: str
    due_ms: int | None  # None: a cancel


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Op], list[tuple[str, int]]]:
    """Requests in write order, and the worker's actions: ("apply", how many) or ("tick", second)."""
    count = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.integers(0, 700), min_size=count, max_size=count))
    ops: list[Op] = []
    written = T_MS - 1500
    for n, gap in enumerate(gaps):
        written += gap
        timer_id = draw(st.sampled_from(IDS))
        if draw(st.booleans()) or not ops:
            # Due times are distinct (+ n), so a version is told apart by its due time.
            due = written + draw(st.integers(-800, 2500)) // 10 * 10 + n
            ops.append(Op(written, timer_id, due))
        else:
            ops.append(Op(written, timer_id, None))
    actions = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("apply"), st.integers(1, 3)),
                st.tuples(st.just("tick"), st.integers(-1, 6)),
            ),
            max_size=16,
        )
    )
    return ops, actions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_any_interleaving_of_requests_and_ticks_keeps_the_join_guarantees(history) -> None:
    ops, actions = history
    directory = Path(tempfile.mkdtemp(prefix="join-order-"))
    rig = new_rig(directory)
    try:
        applied = 0
        tick_s = T - 2

        def apply(n: int) -> None:
            nonlocal applied
            for op in ops[applied : applied + n]:
                rig.now = max(rig.now, op.written_ms)  # a request is read after it was written
                record = rig.cancel(op.timer_id) if op.due_ms is None else rig.request(op.timer_id, op.due_ms)
                rig.ingest(record)
                applied += 1
            if applied < len(ops):
                rig.frontier.behind[0] = ops[applied].written_ms
            else:
                rig.frontier.behind.pop(0, None)
            rig.fire_ready()  # the consumer wakes the engine after each step

        apply(0)
        for action, value in actions:
            if action == "apply":
                apply(value)
            else:
                tick_s = max(tick_s, T + value)
                rig.tick(tick_s)
        # Then everything is applied and the clock runs on until every timer is due.
        apply(len(ops))
        last_due = max((op.due_ms for op in ops if op.due_ms is not None), default=T_MS)
        for second in range(tick_s + 1, max(last_due // 1000, tick_s) + 2):
            rig.tick(second)

        fired = [
            (cb.header("kt-id").decode(), int(cb.header("kt-due-ms")), int(cb.header("kt-fired-ms")))
            for cb in rig.callbacks()
        ]
        versions = [(timer_id, due) for timer_id, due, _ in fired]
        assert len(versions) == len(set(versions)), f"a timer fired twice: {fired}"
        for timer_id, due, fired_ms in fired:
            assert fired_ms >= due, f"{timer_id} due {due} fired early, at {fired_ms}"
        for n, op in enumerate(ops):
            if op.due_ms is None:
                continue
            later = [o for o in ops[n + 1 :] if o.timer_id == op.timer_id]
            version = (op.timer_id, op.due_ms)
            if not later:
                assert version in versions, f"{version} never fired: {fired}"
            elif later[0].written_ms < op.due_ms:
                # Replaced or cancelled before it was due: that request wins.
                assert version not in versions, f"{version} fired though {later[0]} came before it was due"
        assert rig.table(0).pending == 0
    finally:
        rig.close()
        shutil.rmtree(directory, ignore_errors=True)
