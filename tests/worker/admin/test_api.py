"""The admin API on a running worker: list, page, find, cancel, reschedule, auth, bad input, routes."""

from __future__ import annotations

import random
import time
import urllib.parse
import uuid

import pytest

from ktimers.wire import TimerEvent
from tests.integration.conftest import Stack
from tests.worker.admin.conftest import ADMIN_TOKEN, OSCILLATOR, AdminHttp, wait_for

pytestmark = pytest.mark.integration

Kind = TimerEvent.Kind


def far_window() -> int:
    """The start (epoch ms) of a due-time window no other test uses: days ahead, at a random minute."""
    return (int(time.time()) + 86400 * random.randint(2, 300) + 60 * random.randint(0, 1440)) * 1000


def path(timer_id: str, action: str = "") -> str:
    return f"/api/timers/{urllib.parse.quote(timer_id, safe='')}{action}"


def events_for(stack: Stack, timer_id: str) -> list[int]:
    return [e.kind for e in stack.events() if e.id == timer_id]


def test_lists_pages_and_finds_pending_timers(admin_stack: Stack, http: AdminHttp) -> None:
    start = far_window()
    ids = [f"page-{uuid.uuid4().hex[:6]}-{i}" for i in range(25)]
    with admin_stack.client() as client:
        for i, timer_id in enumerate(ids):
            client.schedule("cb-admin", f"k{i}", f"payload {i}", at=(start + i * 1000) / 1000, id=timer_id)
    window = f"from_ms={start}&to_ms={start + 25_000}"
    wait_for(
        lambda: len(http.get(f"/api/timers?{window}&limit=100").body["timers"]) == 25,
        timeout_s=20,
        what="25 scheduled timers listed",
    )

    seen: list[str] = []
    dues: list[int] = []
    pages = 0
    after = ""
    while True:
        reply = http.get(
            f"/api/timers?{window}&limit=10" + (f"&after={urllib.parse.quote(after)}" if after else "")
        )
        assert reply.status == 200, reply.body
        pages += 1
        seen += [t["id"] for t in reply.body["timers"]]
        dues += [t["due_ms"] for t in reply.body["timers"]]
        if reply.body["next"] is None:
            break
        after = reply.body["next"]
    assert pages == 3
    assert seen == ids  # earliest first, each once, across the 4 partitions
    assert dues == sorted(dues) and dues[0] == start

    # The window bounds are honoured: [from, to) of the middle ten.
    middle = http.get(f"/api/timers?from_ms={start + 10_000}&to_ms={start + 20_000}").body["timers"]
    assert [t["id"] for t in middle] == ids[10:20]

    detail = http.get(path(ids[3]))
    assert detail.status == 200
    assert detail.body["due_ms"] == start + 3000
    assert (detail.body["callback_topic"], detail.body["callback_key"]) == ("cb-admin", "k3")
    assert (detail.body["payload_bytes"], detail.body["payload_shown"]) == (len("payload 3"), False)
    shown = http.get(path(ids[3]) + "?payload=1").body
    assert (shown["payload"], shown["payload_encoding"]) == ("payload 3", "utf-8")

    partitions = http.get("/api/partitions").body["partitions"]
    assert [p["partition"] for p in partitions] == [0, 1, 2, 3]
    per_partition = http.get(f"/api/timers?{window}&partition={detail.body['partition']}").body["timers"]
    assert ids[3] in [t["id"] for t in per_partition]
    assert {t["partition"] for t in per_partition} == {detail.body["partition"]}
    assert sum(p["pending"] for p in partitions) >= 25


def test_cancel_by_id_is_a_cancel_request(admin_stack: Stack, http: AdminHttp) -> None:
    reader = admin_stack.callback_topic("admin-cancel")
    timer_id = f"cancel-{uuid.uuid4().hex[:8]}"
    with admin_stack.client() as client:
        client.schedule(reader.topic, "c", "must not fire", delay=4, id=timer_id)
    wait_for(lambda: http.get(path(timer_id)).status == 200, timeout_s=10, what="timer visible")

    reply = http.post(path(timer_id, "/cancel"))
    assert reply.status == 202, reply.body
    assert reply.body["status"] == "cancel-sent"

    # The engine applied it as any cancel: the same timer-events record, and it is gone.
    wait_for(
        lambda: Kind.CANCELLED in events_for(admin_stack, timer_id), timeout_s=10, what="CANCELLED event"
    )
    assert events_for(admin_stack, timer_id) == [Kind.SCHEDULED, Kind.CANCELLED]
    gone = http.get(path(timer_id))
    assert gone.status == 404 and timer_id in gone.body["error"]
    assert http.post(path(timer_id, "/cancel")).status == 404
    reader.poll(5.0)  # past its due time
    assert reader.records == []


def test_reschedule_moves_the_due_time_and_it_fires_then(admin_stack: Stack, http: AdminHttp) -> None:
    reader = admin_stack.callback_topic("admin-resched")
    timer_id = f"resched-{uuid.uuid4().hex[:8]}"
    with admin_stack.client() as client:
        client.schedule(reader.topic, "r", "moved", at=far_window() / 1000, id=timer_id, headers={"h": "v"})
    wait_for(lambda: http.get(path(timer_id)).status == 200, timeout_s=10, what="timer visible")

    new_due = int(time.time() * 1000) + 2000
    reply = http.post(path(timer_id, "/reschedule"), {"due_ms": new_due})
    assert reply.status == 202, reply.body

    callbacks = reader.read_until(lambda r: len(r) >= 1, timeout_s=15)
    assert [(c.timer_id, c.value, c.due_ms) for c in callbacks] == [(timer_id, b"moved", new_due)]
    assert ("h", b"v") in callbacks[0].headers  # the stored Future was sent again whole
    assert callbacks[0].received_ms >= new_due

    # What the page shows: the firing with its lateness, the clocks and the oscillator.
    def fired() -> list[dict[str, object]]:
        return [f for f in http.get("/api/firings").body["firings"] if f["id"] == timer_id]

    firing = wait_for(fired, timeout_s=5, what="firing listed")[0]
    assert firing["due_ms"] == new_due and 0 <= float(firing["lateness_s"]) < 5
    stats = http.get("/api/stats").body
    assert stats["fired_last_minute"] >= 1 and stats["lateness"]["p50_s"] is not None
    assert not any(p["stalled"] for p in stats["partitions"]), stats["partitions"]
    assert [o["source"] for o in stats["oscillators"]] == [OSCILLATOR]
    assert stats["mutations_enabled"] is True


def test_mutations_need_the_token(admin_stack: Stack, http: AdminHttp) -> None:
    timer_id = f"auth-{uuid.uuid4().hex[:8]}"
    with admin_stack.client() as client:
        client.schedule("cb-admin", "a", "kept", at=far_window() / 1000, id=timer_id)
    wait_for(lambda: http.get(path(timer_id)).status == 200, timeout_s=10, what="timer visible")

    for token in (None, "wrong-token-0123456789", ADMIN_TOKEN + "x"):
        reply = http.post(path(timer_id, "/cancel"), token=token)
        assert reply.status == 401, reply.body
        assert "Authorization: Bearer" in reply.body["error"]
        assert reply.headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert http.post(path(timer_id, "/reschedule"), {"delay_s": 1}, token=None).status == 401
    time.sleep(1.0)
    assert http.get(path(timer_id)).status == 200  # still pending
    assert Kind.CANCELLED not in events_for(admin_stack, timer_id)


def test_timers_are_read_only_with_the_token_and_payloads_never_logged(
    admin_stack: Stack, http: AdminHttp
) -> None:
    start = far_window()
    timer_id = f"private-{uuid.uuid4().hex[:8]}"
    secret = f"national id {uuid.uuid4().hex}"
    with admin_stack.client() as client:
        client.schedule("cb-admin", "patient-9", secret, at=start / 1000, id=timer_id)
    wait_for(lambda: http.get(path(timer_id)).status == 200, timeout_s=10, what="timer visible")

    reads = {
        "list": "/api/timers",
        "search": f"/api/timers?from_ms={start}&to_ms={start + 1}",
        "one timer": path(timer_id),
        "its payload": path(timer_id, "?payload=1"),
        "firings": "/api/firings",
    }
    for what, read in reads.items():
        for token in (None, "wrong-token-0123456789", ADMIN_TOKEN + "x"):
            refused = http.get(read, token=token)
            assert refused.status == 401, (what, token, refused.body)
            assert "Authorization: Bearer" in refused.body["error"]
            assert refused.headers.get("WWW-Authenticate", "").startswith("Bearer")
            assert timer_id not in str(refused.body)
        assert http.get(read).status == 200, what

    found = http.get(reads["search"]).body["timers"]
    assert [(t["id"], t["payload_bytes"]) for t in found] == [(timer_id, len(secret))]
    assert secret not in str(http.get(reads["list"]).body) + str(http.get(reads["one timer"]).body)
    assert http.get(reads["its payload"]).body["payload"] == secret
    # Shown when asked for, and nowhere in the worker's output (its access log included).
    assert admin_stack.worker is not None
    assert secret not in admin_stack.worker.output()


FAUST_VIEWS = ("/", "/router/", "/router/timers/", "/router/key/", "/table/", "/table/timers/", "/stats/")


def test_only_our_routes_are_served(http: AdminHttp) -> None:
    for faust_view in FAUST_VIEWS:
        assert http.get(faust_view).status == 404, faust_view
    # Probes, the Prometheus scrape, counts and the page itself need no token.
    for open_path in ("/metrics", "/healthz", "/readyz", "/api/stats", "/admin/"):
        assert http.get(open_path, token=None).status == 200, open_path
    assert http.get("/api/stats", token=None).body["timer_reads"] == "token"


def test_the_metrics_port_serves_the_metrics_and_no_admin_route(admin_stack: Stack, http: AdminHttp) -> None:
    metrics = AdminHttp(int(admin_stack.env["TIMERS_METRICS_PORT"]))
    scrape = metrics.get("/metrics", token=None)
    assert scrape.status == 200 and "timers_fired_total" in scrape.body
    for path in ("/api/stats", "/api/timers", "/admin/", "/healthz", "/readyz"):
        assert metrics.get(path).status == 404, path
    # The web port keeps its /metrics: scrapers set up for it go on working.
    assert http.get("/metrics", token=None).status == 200


@pytest.mark.parametrize(
    ("request_path", "status", "mentions"),
    [
        ("/api/timers?from_ms=yesterday", 400, "from_ms"),
        ("/api/timers?to_ms=-5", 400, "to_ms"),
        ("/api/timers?form_ms=2000", 400, "form_ms"),
        ("/api/timers/no-such-timer?payload=true", 400, "payload"),
        ("/api/timers?limit=0", 400, "limit"),
        ("/api/timers?limit=100000", 400, "limit"),
        ("/api/timers?after=garbage", 400, "after"),
        ("/api/timers?partition=9", 400, "partition"),
        ("/api/timers?partition=x", 400, "partition"),
        ("/api/firings?limit=abc", 400, "limit"),
        ("/api/timeline?window=week", 400, "window"),
        ("/api/timers/no-such-timer", 404, "no-such-timer"),
    ],
)
def test_bad_reads_are_4xx_with_a_reason(
    http: AdminHttp, request_path: str, status: int, mentions: str
) -> None:
    reply = http.get(request_path)
    assert reply.status == status, reply.body
    assert mentions in reply.body["error"]


@pytest.mark.parametrize(
    ("body", "mentions"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"due_ms": 1, "delay_s": 1}', "exactly one"),
        (b'{"due_ms": "tomorrow"}', "due_ms"),
        (b'{"delay_s": -3}', "delay_s"),
        (b'{"when": 5}', "unknown field"),
    ],
)
def test_bad_reschedule_bodies_are_400(http: AdminHttp, body: bytes, mentions: str) -> None:
    reply = http.request("POST", path("any-id", "/reschedule"), body, ADMIN_TOKEN)
    assert reply.status == 400, reply.body
    assert mentions in reply.body["error"]


def test_openapi_spec_is_served(http: AdminHttp) -> None:
    spec = http.get("/api/openapi.json")
    assert spec.status == 200
    assert spec.body["openapi"].startswith("3.")
    assert "/api/timers/{timer_id}/cancel" in spec.body["paths"]


def test_page_is_served_with_its_assets(http: AdminHttp) -> None:
    for asset, kind in (
        ("/admin/", "text/html"),
        ("/admin/app.js", "javascript"),
        ("/admin/style.css", "css"),
    ):
        reply = http.get(asset)
        assert reply.status == 200 and kind in reply.headers["Content-Type"], asset
        assert "frame-ancestors 'none'" in reply.headers["Content-Security-Policy"]
