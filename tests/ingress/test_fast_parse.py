"""The native format's fast path (what the Spark jobs decode with) agrees with the full parser.

:func:`futures.ingress.native.fast_parse` either answers exactly what
:func:`futures.ingress.requests.parse_record` answers for the record, or defers to it.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from futures.ingress.base import MAX_DUE_MS
from futures.ingress.limits import ParseLimits
from futures.ingress.native import fast_parse
from futures.ingress.records import SourceRecord
from futures.ingress.requests import CancelRequest, RequestParser, Schedule
from ktimers.config import TopicsConfig
from ktimers.wire import KIND_BATCH, KIND_CANCEL, KIND_FUTURE, KIND_HEADER, MAX_ID_BYTES, Cancel, Future

NOW_MS = 1_795_000_000_000
#: What the jobs parse with: no payload limit (futures.jobs.config.JobConfig.parse_limits).
JOBS = ParseLimits.permissive(TopicsConfig())
CONFIGS = [JOBS, replace(JOBS, max_due_ahead_s=3600.0)]

ids = st.one_of(
    st.just(""),
    st.text(min_size=1, max_size=20),
    st.just("é" * (MAX_ID_BYTES // 2)),  # exactly the limit, in bytes
    st.just("é" * (MAX_ID_BYTES // 2) + "x"),  # one byte over
)
dues = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=NOW_MS - 10, max_value=NOW_MS + 7_200_000),
    st.sampled_from([0, MAX_DUE_MS, MAX_DUE_MS + 1, -1]),
)
topics = st.sampled_from(
    ["orders", "", "not a topic!", "__consumer_offsets", "x-changelog", JOBS.topics.request, "a" * 250]
)


@st.composite
def future_values(draw: st.DrawFn) -> bytes:
    future = Future(id=draw(ids), callBackTopic=draw(topics), callBack=draw(st.binary(max_size=8)))
    due = draw(dues)
    if due is not None:
        future.due_ms = due
    return future.SerializeToString()


values = st.one_of(
    future_values(),
    ids.map(lambda i: Cancel(id=i).SerializeToString()),
    st.binary(max_size=16),
    st.none(),
)
kinds = st.sampled_from([None, KIND_FUTURE, KIND_CANCEL, KIND_BATCH, b"frobnicate", b""])


@settings(max_examples=600, deadline=None)
@given(
    kind=kinds,
    value=values,
    key=st.sampled_from([None, b"1795000000", b"k"]),
    config=st.sampled_from(CONFIGS),
)
def test_fast_path_answers_what_the_parser_answers(
    kind: bytes | None, value: bytes | None, key: bytes | None, config: ParseLimits
) -> None:
    headers = () if kind is None else ((KIND_HEADER, kind),)
    record = SourceRecord(JOBS.topics.request, 2, 77, key, value, headers, NOW_MS)
    parser = RequestParser(config, NOW_MS)
    fast = fast_parse(kind, value, parser.context)
    if fast is None:
        return
    [slow] = parser.parse(record)
    if isinstance(fast, str):
        assert isinstance(slow, CancelRequest)
        assert slow.timer_id == fast
    else:
        assert isinstance(slow, Schedule)
        assert (slow.timer_id, slow.due_ms, slow.timer.future) == (fast.id, fast.due_ms, fast)
        # The jobs keep the record's value as the timer's Future: it is the normalised one.
        assert value is not None
        assert Future.FromString(value) == slow.timer.future


def test_fast_path_takes_the_common_records_and_leaves_the_rest() -> None:
    context = RequestParser(JOBS, NOW_MS).context
    plain = Future(id="a", due_ms=NOW_MS, callBackTopic="orders").SerializeToString()
    found = fast_parse(None, plain, context)
    assert isinstance(found, Future)
    assert (found.id, found.due_ms) == ("a", NOW_MS)
    assert fast_parse(KIND_CANCEL, Cancel(id="a").SerializeToString(), context) == "a"
    # A seed (no id, due from the key), a batch, a bad record: the full parser decides.
    assert fast_parse(None, Future(callBackTopic="orders").SerializeToString(), context) is None
    assert fast_parse(KIND_BATCH, plain, context) is None
    assert fast_parse(None, b"\xff\xff", context) is None
    # With a payload limit, sizes must be checked: the worker's default config never takes the fast path.
    assert fast_parse(None, plain, RequestParser(ParseLimits(), NOW_MS).context) is None
