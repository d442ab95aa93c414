"""What the transport keeps of the offsets its consumer read past, and what it acks of them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from futures.worker.passed import PassedOffsets

TP = ("timer-request", 0)


def test_runs_merge_and_a_hole_counts_as_read_past_only_if_all_of_it_was() -> None:
    passed = PassedOffsets()
    passed.add(TP, 3, 4)
    passed.add(TP, 7, 9)
    passed.add(TP, 4, 5)  # touches the first run
    assert passed.spans(TP) == [(3, 5), (7, 9)]
    assert passed.covers(TP, 3, 5) and passed.covers(TP, 8, 9)
    assert not passed.covers(TP, 4, 8), "offsets 5 and 6 were not read past"
    assert not passed.covers(("timer-request", 1), 3, 4)


def test_what_continues_the_applied_requests_is_acked_at_once_the_rest_when_reached() -> None:
    passed = PassedOffsets()
    assert passed.add(TP, 3, 4) == []  # nothing applied yet: a marker before the first request
    assert passed.applied(TP, 5) == [(3, 4)]  # requests up to 5 applied
    assert passed.spans(TP) == []
    assert passed.add(TP, 6, 7) == [(6, 7)]  # the marker after them, reported later
    assert passed.add(TP, 9, 10) == []  # ahead of requests not applied yet
    assert passed.applied(TP, 8) == [(9, 10)]
    assert passed.spans(TP) == [(9, 10)], "kept until a later request: the engine's next hole starts there"
    assert passed.applied(TP, 10) == []
    assert passed.spans(TP) == []


def test_offsets_read_past_where_the_consumer_resumes_are_acked_before_any_request() -> None:
    # A restart resumes just past the last applied request: a marker there is acked as soon as
    # it is read past, also on a partition that gets no request for a while.
    passed = PassedOffsets()
    passed.resume_at(TP, 40)
    assert passed.add(TP, 40, 41) == [(40, 41)]
    assert passed.add(TP, 41, 45) == [(41, 45)]
    assert passed.applied(TP, 45) == []


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[bool], list[tuple[int, int]]]:
    """A partition's offsets (True: a request record, False: no record for the consumer), and the
    runs of the latter as a consumer reports them: in order, cut anywhere."""
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=60))
    runs: list[tuple[int, int]] = []
    offset = 0
    while offset < len(kinds):
        if kinds[offset]:
            offset += 1
            continue
        end = offset
        while end < len(kinds) and not kinds[end]:
            end += 1
        cut = draw(st.integers(offset, end))
        runs += [(offset, cut), (cut, end)] if offset < cut < end else [(offset, end)]
        offset = end
    return kinds, runs


@settings(max_examples=300, deadline=None)
@given(logs(), st.data())
def test_only_offsets_read_past_are_acked_and_once_all_is_applied_every_offset_is(
    log: tuple[list[bool], list[tuple[int, int]]], data: st.DataObject
) -> None:
    kinds, runs = log
    requests = [o for o, is_request in enumerate(kinds) if is_request]
    passed = PassedOffsets()
    acked: list[int] = []
    reported = 0
    for last in requests:
        # The runs before this request came with it or before it; later ones may have too.
        before = sum(1 for start, _ in runs if start < last)
        more = data.draw(st.integers(max(before - reported, 0), len(runs) - reported))
        for start, end in runs[reported : reported + more]:
            acked += [o for s, e in passed.add(TP, start, end) for o in range(s, e)]
        reported += more
        acked += [o for s, e in passed.applied(TP, last) for o in range(s, e)]
    for start, end in runs[reported:]:
        acked += [o for s, e in passed.add(TP, start, end) for o in range(s, e)]

    assert len(acked) == len(set(acked)), "an offset was acked twice"
    assert all(not kinds[o] for o in acked), "a request's offset was acked as read past"
    if requests:
        # Every offset up to the last request's and every one read past after it: the committed
        # offset reaches the end of the partition.
        assert sorted(acked + requests) == list(range(len(kinds)))
        assert all(start > requests[-1] for start, _ in passed.spans(TP))
    # What a later hole may start on, after the last request applied, is known as it is.
    after = requests[-1] + 1 if requests else 0
    for start in range(after, len(kinds)):
        for end in range(start + 1, len(kinds) + 1):
            assert passed.covers(TP, start, end) == all(not kinds[o] for o in range(start, end))
