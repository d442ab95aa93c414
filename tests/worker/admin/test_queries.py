"""The admin API's read side on real RocksDB tables: bounded range scans, paging, clocks, timeline."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from futures.worker.admin import openapi, params, queries
from futures.worker.admin.params import ApiError, Cursor
from futures.worker.status import PartitionTicks
from futures.worker.table import PartitionTimers, progress_record, table_key
from ktimers.timers_pb2 import Recurrence
from ktimers.wire import Future, StoredTimer

T = 1_795_000_000
T_MS = T * 1000


def stored(timer_id: str, due_ms: int) -> bytes:
    future = Future(
        callBackTopic="cb", callBackKey=f"k-{timer_id}", callBack=b"v", id=timer_id, due_ms=due_ms
    )
    return StoredTimer(future=future, source_partition=0, source_offset=1).SerializeToString()


@pytest.fixture
def tables(tmp_path: Path) -> Iterator[dict[int, PartitionTimers]]:
    opened = {p: PartitionTimers(tmp_path / f"p{p}.db") for p in range(3)}
    yield opened
    for table in opened.values():
        table.close()


def schedule(table: PartitionTimers, timers: list[tuple[str, int]]) -> None:
    table.apply([(table_key(due, tid), stored(tid, due)) for tid, due in timers], offset=None)


def test_iter_range_is_bounded_and_half_open(tables: dict[int, PartitionTimers]) -> None:
    table = tables[0]
    schedule(table, [(f"t{i}", T_MS + i * 1000) for i in range(10)])
    found = list(table.iter_range(T_MS + 2000, T_MS + 6000))
    assert [d.timer_id for d in found] == ["t2", "t3", "t4", "t5"]  # to_ms excluded
    assert [d.timer_id for d in table.iter_range(0, 2**63, limit=3)] == ["t0", "t1", "t2"]
    after = table_key(T_MS + 4000, "t4")
    assert [d.timer_id for d in table.iter_range(0, 2**63, after_key=after, limit=2)] == ["t5", "t6"]


def test_iter_range_starts_past_the_watermark(tables: dict[int, PartitionTimers]) -> None:
    table = tables[0]
    schedule(table, [("late", T_MS + 500), ("next", T_MS + 1500)])
    # Timers due by the watermark have fired; a scan from 0 must not return them even if a
    # stale copy were there — and must not walk the tombstones of fired ones.
    table.apply([(table_key(T_MS + 500, "late"), None), progress_record(T, 7)], offset=None)
    assert [d.timer_id for d in table.iter_range(0, 2**63)] == ["next"]


def test_pages_merge_partitions_in_due_order(tables: dict[int, PartitionTimers]) -> None:
    for p, table in tables.items():
        schedule(table, [(f"p{p}-{i}", T_MS + (i * 3 + p) * 10) for i in range(7)])  # interleaved
    pages, after = [], None
    while True:
        page, after = queries.list_range(tables, 0, params.MAX_DUE_MS, after, limit=5)
        pages.append([(loc.partition, loc.due.due_ms) for loc in page])
        if after is None:
            break
    assert [len(p) for p in pages] == [5, 5, 5, 5, 1]
    flat = [entry for page in pages for entry in page]
    assert [due for _, due in flat] == sorted(due for _, due in flat)
    assert len(set(flat)) == 21


def test_an_exactly_full_last_page_has_no_next(tables: dict[int, PartitionTimers]) -> None:
    schedule(tables[1], [(f"t{i}", T_MS + i) for i in range(4)])
    page, after = queries.list_range(tables, 0, params.MAX_DUE_MS, None, limit=4)
    assert len(page) == 4 and after is None


def test_find_by_id_and_detail(tables: dict[int, PartitionTimers]) -> None:
    schedule(tables[2], [("x", T_MS + 42)])
    located = queries.find(tables, "x")
    assert located is not None and (located.partition, located.due.due_ms) == (2, T_MS + 42)
    detail = queries.detail_json(located)
    assert (detail["callback_key"], detail["payload_bytes"], detail["has_token"]) == ("k-x", 1, False)
    assert "payload" not in detail  # only when asked for
    assert queries.detail_json(located, with_payload=True)["payload"] == "v"
    assert queries.find(tables, "y") is None


def test_partition_clock_goes_red_when_it_stalls(tables: dict[int, PartitionTimers]) -> None:
    table = tables[0]
    fresh = queries.partition_json(0, table, None, T_MS, stall_after_s=5)
    assert fresh["stalled"] and "no tick" in fresh["stall_reason"]
    table.apply([progress_record(T, -1)], offset=None)
    ticks = PartitionTicks(T, T_MS, "osc-a")
    ok = queries.partition_json(0, table, ticks, T_MS + 1200, stall_after_s=5)
    assert (ok["stalled"], ok["clock_lag_s"], ok["last_tick_age_s"]) == (False, 1.2, 1.2)
    stuck = queries.partition_json(0, table, ticks, T_MS + 9000, stall_after_s=5)
    assert stuck["stalled"] and "9s behind" in stuck["stall_reason"]


def test_timeline_buckets_and_overdue(tables: dict[int, PartitionTimers]) -> None:
    minute = T_MS - T_MS % 60_000
    now = minute + 30_000  # half a minute into the first bucket
    schedule(tables[0], [("overdue", minute + 10_000), ("b0", minute + 40_000), ("b2", minute + 150_000)])
    schedule(tables[1], [("b2b", minute + 179_999), ("next-hour", minute + 3_600_000)])
    timeline = queries.timeline_json(tables, now, "hour")
    assert timeline["start_ms"] == minute and timeline["overdue"] == 1
    assert timeline["buckets"][:4] == [1, 0, 2, 0] and sum(timeline["buckets"]) == 3


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ({"from_ms": "1.5"}, "from_ms"),
        ({"from_ms": "99999999999999999999"}, "from_ms"),
        ({"limit": "1001"}, "limit"),
        ({"limit": " 5"}, "limit"),
        ({"after": "12"}, "after"),
        ({"after": ":id"}, "after"),
    ],
)
def test_bad_query_values_are_400(query: dict[str, str], problem: str) -> None:
    with pytest.raises(ApiError) as caught:
        params.epoch_ms(query, "from_ms", 0)
        params.limit(query)
        params.cursor(query)
    assert caught.value.status == 400 and problem in caught.value.message


def test_cursor_round_trips_ids_with_colons() -> None:
    cursor = Cursor(T_MS, "order:17:retry")
    assert params.cursor({"after": cursor.encode()}) == cursor


def test_reschedule_body() -> None:
    assert params.reschedule_body({"due_ms": T_MS}, now_ms=0).due_ms == T_MS
    assert params.reschedule_body({"delay_s": 1.5}, now_ms=T_MS).due_ms == T_MS + 1500
    for bad in ({"due_ms": True}, {"delay_s": float("nan")}, {}, None, {"due_ms": 2**63}):
        with pytest.raises(ApiError):
            params.reschedule_body(bad, now_ms=T_MS)


def test_a_recurring_timer_shows_its_series_and_the_occurrence_after_the_pending_one(
    tables: dict[int, PartitionTimers],
) -> None:
    due = T_MS + 500
    future = Future(
        callBackTopic="cb",
        id="daily",
        due_ms=due,
        recurrence=Recurrence(
            interval_ms=86_400_000, max_count=5, ordinal=4, first_due_ms=due - 3 * 86_400_000
        ),
    )
    value = StoredTimer(future=future).SerializeToString()
    tables[0].apply([(table_key(due, "daily"), value)], offset=None)
    located = queries.find(tables, "daily")
    assert located is not None
    series = queries.detail_json(located)["series"]
    assert series["occurrence"] == 4
    assert series["first_due_ms"] == due - 3 * 86_400_000
    assert series["following_due_ms"] == due + 86_400_000  # the fifth, the last
    assert (series["interval_ms"], series["max_count"], series["cron"]) == (86_400_000, 5, None)
    future.recurrence.ordinal = 5
    tables[0].apply([(table_key(due, "daily"), StoredTimer(future=future).SerializeToString())], offset=None)
    located = queries.find(tables, "daily")
    assert located is not None and queries.detail_json(located)["series"]["following_due_ms"] is None
    assert "series" not in queries.summary_json(located)


PARTITIONS = 4
#: Each query parameter of the API, read as its handler reads it.
READERS: dict[str, Callable[[Mapping[str, str]], object]] = {
    "from_ms": lambda query: params.epoch_ms(query, "from_ms", 0),
    "to_ms": lambda query: params.epoch_ms(query, "to_ms", params.END_MS),
    "limit": params.limit,
    "after": params.cursor,
    "partition": lambda query: params.partition(query, PARTITIONS),
    "payload": lambda query: params.flag(query, "payload"),
    "window": lambda query: params.choice(query, "window", tuple(queries.TIMELINE_WINDOWS)),
}


def _query_schemas() -> list[tuple[str, dict[str, Any]]]:
    found = {}
    for operations in openapi.spec(PARTITIONS)["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                if parameter["in"] == "query":
                    found[parameter["name"]] = parameter["schema"]
    return sorted(found.items())


def _admitted(schema: dict[str, Any], raw: str) -> bool:
    """Whether the document admits query value ``raw``: an integer parameter's text is a
    decimal integer whose value the schema admits, a string parameter's text is the value."""
    if schema["type"] == "integer":
        if not re.fullmatch(r"-?[0-9]+", raw):
            return False
        # Beyond 30 digits, any integer is out of every range here (and int() reads 4,300 at most).
        huge = len(raw.lstrip("-0")) > 30
        value: object = (-1 if raw.startswith("-") else 1) * 10**31 if huge else int(raw)
    else:
        value = raw
    checker = jsonschema.Draft4Validator(schema, format_checker=None)
    return checker.is_valid(value)


QUERY_SCHEMAS = _query_schemas()
VALUES = st.one_of(
    st.text(max_size=24),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", "0", "1", "-0", "007", "true", "hour", "day", "5:id", "5:", ":id", "1:\n"]),
    st.builds(lambda due, ident: f"{due}:{ident}", st.integers(0, 10**16), st.text(max_size=8)),
)


def test_every_query_parameter_has_a_reader() -> None:
    assert sorted(READERS) == [name for name, _ in QUERY_SCHEMAS]


@pytest.mark.parametrize(("name", "schema"), QUERY_SCHEMAS, ids=[name for name, _ in QUERY_SCHEMAS])
@given(raw=VALUES)
@example(raw="")
@example(raw="9" * 5000)
def test_a_query_value_is_taken_exactly_when_the_document_admits_it(
    name: str, schema: dict[str, Any], raw: str
) -> None:
    try:
        READERS[name]({name: raw})
    except ApiError as refused:
        assert refused.status == 400 and name in refused.message
        assert not _admitted(schema, raw), f"{name}={raw!r} is admitted by {schema} but refused"
    else:
        assert _admitted(schema, raw), f"{name}={raw!r} is taken but {schema} refuses it"
