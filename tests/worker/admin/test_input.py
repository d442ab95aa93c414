"""The admin API's edges, on the live server with a real engine behind it (no broker).

A reschedule the API accepts (202) is one the worker applies; one it would refuse is not
sent (409, with the dead-letter reason); a series keeps its rule and numbering; and the
query values the OpenAPI document refuses are refused (400).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from futures.ingress.base import MAX_DUE_MS
from futures.worker.admin import openapi
from futures.worker.admin.params import FIRINGS_LIMIT
from futures.worker.config import LatePolicy
from ktimers.wire import TimerEvent
from tests.worker.admin.live import SERIES_DUE_MS, SERIES_FIRST_MS, LiveApi
from tests.worker.rig import T_MS

EVERY_MINUTE = 60_000


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveApi]:
    api = LiveApi(tmp_path)
    yield api
    api.close()


def requests_sent(live: LiveApi) -> int:
    return len(live.rig.producer.on(live.rig.topics.request))


def reschedule(live: LiveApi, timer_id: str, body: object) -> tuple[int, dict[str, object]]:
    reply = live.call("POST", f"/api/timers/{timer_id}/reschedule", body)
    return reply.status, reply.body


@pytest.mark.parametrize("due_ms", [2**63 - 1, 2**63, MAX_DUE_MS + 1, -1])
def test_a_due_time_beyond_what_the_wire_takes_is_400_and_nothing_is_sent(live: LiveApi, due_ms: int) -> None:
    status, body = reschedule(live, "plain", {"due_ms": due_ms})
    assert status == 400, body
    assert "due_ms" in str(body["error"]) and str(MAX_DUE_MS) in str(body["error"])
    assert requests_sent(live) == 0


def test_the_latest_due_time_the_wire_takes_is_rescheduled_and_applied(live: LiveApi) -> None:
    status, body = reschedule(live, "plain", {"due_ms": MAX_DUE_MS})
    assert status == 202, body
    live.apply_sent()
    assert live.rig.table(0).due_of("plain") == MAX_DUE_MS
    assert live.rig.dlq() == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/timers/plain?payload=1", None),
        ("POST", "/api/timers/plain/cancel", None),
        ("POST", "/api/timers/plain/reschedule", {"delay_s": 60}),
    ],
)
def test_no_cache_keeps_a_payload_or_an_accepted_change(
    live: LiveApi, method: str, path: str, body: object
) -> None:
    reply = live.call(method, path, body)
    assert reply.status in (200, 202), reply.body
    assert reply.headers["Cache-Control"] == "no-store"


def test_rescheduling_a_series_moves_its_pending_occurrence_and_keeps_the_series(live: LiveApi) -> None:
    before = live.call("GET", "/api/timers/series").body["series"]
    new_due = SERIES_DUE_MS + 30_000
    status, body = reschedule(live, "series", {"due_ms": new_due})
    assert status == 202, body
    live.apply_sent()

    after = live.call("GET", "/api/timers/series").body
    assert after["due_ms"] == new_due
    # Same rule, limits, first occurrence and ordinal: the third occurrence moved.
    assert after["series"] == {**before, "following_due_ms": new_due + EVERY_MINUTE}
    assert (after["series"]["occurrence"], after["series"]["first_due_ms"]) == (3, SERIES_FIRST_MS)

    # It fires as the third, and the fourth is armed one interval after the new due time.
    live.rig.tick(new_due // 1000 + 1)
    live.rig.fire_ready()
    fired = live.rig.callbacks()
    assert [(cb.header("kt-id"), cb.header("kt-occurrence")) for cb in fired] == [(b"series", b"3")]
    following = live.stored("series").future
    assert (following.due_ms, following.recurrence.ordinal) == (new_due + EVERY_MINUTE, 4)
    assert following.recurrence.max_count == 5


@pytest.mark.parametrize(
    ("due_ms", "why"),
    [
        (SERIES_FIRST_MS - 1, "first_due_ms"),  # before the series' first occurrence
        (0, "first_due_ms"),
    ],
)
def test_a_series_moved_out_of_its_bounds_is_409_and_nothing_is_sent(
    live: LiveApi, due_ms: int, why: str
) -> None:
    status, body = reschedule(live, "series", {"due_ms": due_ms})
    assert status == 409, body
    assert body["reason"] == "invalid-recurrence" and why in str(body["error"])
    assert requests_sent(live) == 0


@pytest.mark.parametrize(
    ("settings", "body", "reason"),
    [
        ({"max_due_ahead_s": 3600.0}, {"delay_s": 7200}, "due-too-far"),
        ({"max_due_ahead_s": 3600.0}, {"due_ms": T_MS + 86_400_000}, "due-too-far"),
        ({"late_policy": LatePolicy.DLQ, "max_lateness_s": 60.0}, {"due_ms": T_MS - 3_600_000}, "too-late"),
        ({"allowed_callback_topics": ("invoices",)}, {"delay_s": 60}, "callback-topic-not-allowed"),
    ],
)
def test_what_the_worker_would_refuse_is_409_with_its_reason_and_is_not_sent(
    tmp_path: Path, settings: dict[str, object], body: dict[str, object], reason: str
) -> None:
    live = LiveApi(tmp_path, **settings)
    try:
        status, answer = reschedule(live, "plain", body)
        assert status == 409, answer
        assert answer["reason"] == reason
        assert requests_sent(live) == 0
        # And what is within the limits is sent, and applied.
        if reason != "callback-topic-not-allowed":
            assert reschedule(live, "plain", {"delay_s": 30})[0] == 202
            live.apply_sent()
            assert live.rig.table(0).due_of("plain") == live.rig.now + 30_000
            assert live.rig.events(TimerEvent.REJECTED) == []
    finally:
        live.close()


@pytest.mark.parametrize(
    "path",
    [
        "/api/timers/plain?payload=true",
        "/api/timers/plain?payload=",
        "/api/timers/plain?payload=2",
        "/api/timers?limit=",
        "/api/timers?from_ms=",
        "/api/timers?partition=",
        "/api/timers?partition=4",  # the topics have 4 partitions: 0 to 3
        "/api/timers?after=",
        f"/api/timers?to_ms={MAX_DUE_MS + 2}",
        "/api/firings?limit=",
        "/api/timeline?window=",
        "/api/timers?form_ms=5",  # misspelt: not silently ignored
        "/api/stats?verbose=1",
    ],
)
def test_query_values_the_document_refuses_are_400_naming_the_parameter(live: LiveApi, path: str) -> None:
    reply = live.call("GET", path)
    assert reply.status == 400, reply.body
    name = path.split("?")[1].split("=")[0]
    assert name in reply.body["error"]


def test_an_empty_range_is_an_empty_page(live: LiveApi) -> None:
    reply = live.call("GET", f"/api/timers?from_ms={T_MS + 10}&to_ms={T_MS}")
    assert reply.status == 200, reply.body
    assert reply.body["timers"] == [] and reply.body["next"] is None


def test_the_document_states_the_bounds_the_handlers_apply() -> None:
    paths = openapi.spec(4)["paths"]
    timers = {p["name"]: p["schema"] for p in paths["/api/timers"]["get"]["parameters"]}
    assert (timers["partition"]["minimum"], timers["partition"]["maximum"]) == (0, 3)
    assert timers["to_ms"]["maximum"] == timers["to_ms"]["default"] == MAX_DUE_MS + 1
    firings = paths["/api/firings"]["get"]["parameters"][0]["schema"]
    assert firings["default"] == FIRINGS_LIMIT
    body = paths["/api/timers/{timer_id}/reschedule"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["properties"]["due_ms"]["maximum"] == MAX_DUE_MS
