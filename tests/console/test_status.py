"""``timers status`` merges every worker's stats: each partition once, with the worker holding
it, a partition nobody answered for marked so, and any answer's oddities never a crash."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from futures.console.admin import AdminError
from futures.console.status import cluster_status, status_tables
from tests.console.test_admin import JSON, CannedApi
from tests.ingress.fuzzing import FUZZ


def stats(partitions: list[int], elsewhere: dict[str, list[int]], osc_age: float, letters: int) -> dict:
    return {
        "ready": True,
        "pending": 5,
        "next_due_ms": 1_800_000_000_000,
        "partitions": [
            {"partition": p, "pending": p, "watermark_s": 1_800_000_000, "clock_lag_s": 0.5, "stalled": False}
            for p in partitions
        ],
        "elsewhere": elsewhere,
        "oscillators": [{"source": "osc-a", "last_second": 1_800_000_000, "age_s": osc_age, "stale": False}],
        "dead_letters": {"undecodable": {"count": letters, "last_ms": 1}},
    }


def test_every_partition_once_with_its_worker_and_the_lag_of_the_group() -> None:
    api = CannedApi(
        [(200, stats([0, 1], {"http://b": [2]}, 0.9, 2)), (200, stats([2], {"http://first": [0, 1]}, 0.2, 3))]
    )
    status = cluster_status(api, 4, lag=lambda n: {0: 0, 1: 7})
    assert [(p["partition"], p["worker"], p["request_lag"]) for p in status["partitions"]] == [
        (0, "http://first", 0),
        (1, "http://first", 7),
        (2, "http://b", None),
        (3, None, None),  # nobody holds it
    ]
    assert [w["partitions"] for w in status["workers"]] == [[0, 1], [2]]
    assert status["oscillators"][0]["age_s"] == 0.2  # the freshest sighting
    assert status["dead_letters"] == {"undecodable": 5}
    text = status_tables(status)
    assert "2027-01-15T08:00:00.000Z" in text  # a clock as a time
    assert "\n3          -" in text


@settings(FUZZ, max_examples=60)
@given(st.lists(st.tuples(st.sampled_from([200, 200, 401, 500]), st.dictionaries(
    st.sampled_from(["partitions", "oscillators", "dead_letters", "elsewhere", "lateness", "ready"]),
    JSON | st.lists(st.dictionaries(st.sampled_from(["partition", "source", "age_s", "count"]), JSON)),
)), min_size=1, max_size=3))  # fmt: skip
def test_any_answer_gives_a_status_or_an_admin_error(bodies) -> None:
    try:
        status = cluster_status(CannedApi(list(bodies)), 3, lag=lambda n: {})
    except AdminError:
        return
    json.dumps(status)
    status_tables(status)
