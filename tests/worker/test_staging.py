"""A step's timers staged into the table (the compiled futures/worker/staging.pyx), judged by
what each request asks: latest wins, cancels win, late timers fire or are refused by policy."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from futures.worker.config import LatePolicy
from tests.worker.rig import T_MS, Kind, T, new_rig

MAX_LATENESS_S = 60
NOW_MS = T_MS + 100  # the clock while the step is applied; the partition's clock is at T

#: ("schedule", id, due second relative to T) or ("cancel", id, 0): due seconds from 200 s
#: before T (refused unless the policy fires late timers) through T (late: fired at once) to
#: 5 s after it (pending).
_requests = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.sampled_from("abcd"), st.integers(-200, 5)),
        st.tuples(st.just("cancel"), st.sampled_from("abcd"), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(
    before=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 5)), max_size=6),
    requests=_requests,
    policy=st.sampled_from(list(LatePolicy)),
)
def test_a_step_leaves_each_ids_latest_accepted_version_and_fires_only_that(
    before: list[tuple[str, int]], requests: list[tuple[str, str, int]], policy: LatePolicy
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        rig = new_rig(Path(directory), late_policy=policy, max_lateness_s=MAX_LATENESS_S)
        try:
            # Versions already in the table, due after the partition's clock.
            rig.ingest(*(rig.request(i, T_MS + s * 1000, payload=b"before") for i, s in before))
            rig.tick(T)
            rig.now = NOW_MS

            expected = {i: (T_MS + s * 1000, b"before") for i, s in before}
            refused: list[str] = []
            records = []
            for n, (kind, timer_id, second) in enumerate(requests):
                if kind == "cancel":
                    records.append(rig.cancel(timer_id))
                    expected.pop(timer_id, None)
                    continue
                due, payload = T_MS + second * 1000, f"{timer_id}-{n}".encode()
                records.append(rig.request(timer_id, due, payload=payload))
                expected.pop(timer_id, None)  # replaced: not fired, even when the new one is refused
                too_late = (NOW_MS - due) / 1000 > MAX_LATENESS_S
                if too_late and policy is not LatePolicy.FIRE:
                    refused.append(timer_id)
                else:
                    expected[timer_id] = (due, payload)
            rig.ingest(*records)

            late = sorted((due, i) for i, (due, _) in expected.items() if due <= T_MS)
            assert rig.fired() == [i for _, i in late]  # accepted already due: fired with the step
            later = {i: v for i, v in expected.items() if v[0] > T_MS}
            assert sorted(rig.pending_ids()) == sorted(later)
            assert rig.table(0).pending == len(later)
            assert [e.id for e in rig.events(Kind.REJECTED)] == refused
            assert len(rig.dlq()) == (len(refused) if policy is LatePolicy.DLQ else 0)

            rig.tick(T + 10)
            fired = {(cb.header("kt-id") or b"").decode(): cb.value for cb in rig.callbacks()}
            assert len(rig.callbacks()) == len(expected)  # each id once
            assert fired == {i: payload for i, (_, payload) in expected.items()}
            assert rig.table(0).pending == 0
        finally:
            rig.close()
