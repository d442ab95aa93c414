"""The worker's web server without a broker: who may call which route, and nothing of Faust's own.

The views are Faust's, served by its aiohttp driver exactly as in a worker; the
timer store is a stand-in over real RocksDB tables under ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer

from futures.worker.admin import openapi
from futures.worker.admin.queries import PAYLOAD_PREVIEW_BYTES
from futures.worker.brokers import BrokerWatch
from futures.worker.config import WorkerConfig
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import WorkerStatus
from futures.worker.table import PartitionTimers, table_key
from futures.worker.web import MetricsServer, register_views
from ktimers.config import Secret
from ktimers.wire import Future, Header, StoredTimer

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
DUE_MS = 2_000_000_000_000
PAYLOAD = "date of birth 1970-01-01"
BIG = b"x" * (PAYLOAD_PREVIEW_BYTES + 100)

CONFIGS = {
    "no token": WorkerConfig(),
    "admin token": WorkerConfig(admin_token=Secret(ADMIN)),
    "both tokens": WorkerConfig(admin_token=Secret(ADMIN), admin_read_token=Secret(READER)),
    "open reads": WorkerConfig(admin_open_reads=True),
}
#: Every read that shows timers themselves.
TIMER_READS = (
    "/api/timers",
    f"/api/timers?from_ms={DUE_MS}&to_ms={DUE_MS + 1}&partition=0",
    "/api/timers/t1",
    "/api/timers/t1?payload=1",
    "/api/firings",
)
#: Reads of counts and clocks, the page and the probes: no token, whatever the configuration.
OPEN_ROUTES = (
    "/metrics",
    "/healthz",
    "/readyz",
    "/api/stats",
    "/api/partitions",
    "/api/timeline",
    "/api/openapi.json",
    "/admin",
    "/admin/",
    "/admin/app.js",
    "/admin/style.css",
    "/admin/favicon.svg",
)
#: What Faust 0.15 routes when left alone, its debug and optional views included.
FAUST_VIEWS = (
    "/",
    "/router/",
    "/router/topics",
    "/router/timers/",
    "/router/timers/key/",
    "/table/",
    "/table/timers/",
    "/table/timers/key/",
    "/graph/",
    "/stats/",
    "/assignment/",
    "/performance/",
)


@dataclass
class Reply:
    status: int
    text: str
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.text)


class HeldTables:
    """The part of TimerStore the views read: tables held here, all recovered."""

    ready = True

    def __init__(self, tables: dict[int, PartitionTimers]) -> None:
        self.tables = tables

    def open_partitions(self) -> dict[int, PartitionTimers]:
        return dict(self.tables)

    def owns(self, partition: int) -> bool:
        return partition in self.tables


def _stored(timer_id: str, payload: bytes, headers: list[Header]) -> tuple[bytes, bytes]:
    future = Future(
        callBackTopic="cb-private", callBackKey="user-17", callBack=payload, id=timer_id, due_ms=DUE_MS
    )
    future.headers.extend(headers)
    return table_key(DUE_MS, timer_id), StoredTimer(future=future).SerializeToString()


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, PartitionTimers]]:
    table = PartitionTimers(tmp_path_factory.mktemp("web") / "p0.db")
    table.apply(
        [
            _stored("t1", PAYLOAD.encode(), [Header(key="email", value=b"someone@example.org")]),
            _stored("big", BIG, []),
        ],
        offset=None,
    )
    yield {0: table}
    table.close()


def worker_app(config: WorkerConfig, tables: dict[int, PartitionTimers]) -> faust.App:
    app = faust.App("web-test", broker="kafka://127.0.0.1:1")
    register_views(
        app,
        WorkerMetrics(),
        cast(Any, HeldTables(tables)),
        config,
        WorkerStatus(),
        cast(Any, None),
        BrokerWatch(config.common.kafka, "timer-request"),
    )
    app.web.init_server()  # what a starting worker does: Faust adds its blueprints here
    return app


class Served:
    """One worker app's web server on 127.0.0.1, with a client; all on one event loop."""

    def __init__(self, app: faust.App, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.client = TestClient(TestServer(cast(Any, app.web).web_app), loop=loop)
        loop.run_until_complete(self.client.start_server())

    def call(self, method: str, path: str, token: str | None = None) -> Reply:
        async def run() -> Reply:
            headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
            response = await self.client.request(method, path, headers=headers)
            return Reply(response.status, await response.text(), dict(response.headers))

        return self.loop.run_until_complete(run())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())


@pytest.fixture(scope="module")
def apps(tables: dict[int, PartitionTimers]) -> Iterator[dict[str, Served]]:
    loop = asyncio.new_event_loop()
    served = {name: Served(worker_app(config, tables), loop) for name, config in CONFIGS.items()}
    yield served
    for one in served.values():
        one.close()
    loop.close()


def expected_read_status(config: str, token: str | None) -> int:
    if config == "open reads":
        return 200
    if config == "no token":
        return 403
    readers = {ADMIN, READER} if config == "both tokens" else {ADMIN}
    return 200 if token in readers else 401


@pytest.mark.parametrize("path", TIMER_READS)
@pytest.mark.parametrize("token", [None, "wrong-token-0123456789", READER, ADMIN])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_timers_are_read_only_with_a_token_that_reads(
    apps: dict[str, Served], config: str, token: str | None, path: str
) -> None:
    reply = apps[config].call("GET", path, token)
    status = expected_read_status(config, token)
    assert reply.status == status, reply.text
    if status == 401:
        assert "Authorization: Bearer" in reply.json["error"]
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    if status == 403:
        # Says how to enable them, and that opening them is a choice of its own.
        for setting in ("TIMERS_ADMIN_READ_TOKEN", "TIMERS_ADMIN_TOKEN", "TIMERS_ADMIN_OPEN_READS=1"):
            assert setting in reply.json["error"]
    if status != 200:
        assert "user-17" not in reply.text and "t1" not in reply.text


def test_a_refused_read_does_not_say_whether_the_timer_exists(apps: dict[str, Served]) -> None:
    assert apps["admin token"].call("GET", "/api/timers/no-such-timer").status == 401
    assert apps["admin token"].call("GET", "/api/timers/no-such-timer", ADMIN).status == 404


@pytest.mark.parametrize("path", OPEN_ROUTES)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_counts_clocks_probes_and_the_page_need_no_token(
    apps: dict[str, Served], config: str, path: str
) -> None:
    reply = apps[config].call("GET", path)
    assert reply.status == 200, reply.text
    assert PAYLOAD not in reply.text and "user-17" not in reply.text


@pytest.mark.parametrize(
    ("config", "reads"), [("no token", "disabled"), ("both tokens", "token"), ("open reads", "open")]
)
def test_stats_tell_the_page_how_timers_are_read(apps: dict[str, Served], config: str, reads: str) -> None:
    assert apps[config].call("GET", "/api/stats").json["timer_reads"] == reads


def test_the_payload_is_shown_only_when_asked_for_and_capped(apps: dict[str, Served]) -> None:
    app = apps["both tokens"]
    listed = app.call("GET", "/api/timers", READER).json["timers"]
    assert {t["id"]: t["payload_bytes"] for t in listed} == {"t1": len(PAYLOAD), "big": len(BIG)}

    plain = app.call("GET", "/api/timers/t1", READER)
    assert plain.json["payload_shown"] is False
    assert "payload" not in plain.json
    assert plain.json["headers"] == [{"key": "email", "value_bytes": len("someone@example.org")}]
    assert PAYLOAD not in plain.text and "someone@example.org" not in plain.text
    assert PAYLOAD not in app.call("GET", "/api/timers", READER).text

    shown = app.call("GET", "/api/timers/t1?payload=1", READER).json
    assert (shown["payload"], shown["payload_encoding"], shown["payload_truncated"]) == (
        PAYLOAD,
        "utf-8",
        False,
    )
    assert shown["headers"] == [
        {"key": "email", "value_bytes": len("someone@example.org"), "value": "someone@example.org"}
    ]
    big = app.call("GET", "/api/timers/big?payload=1", READER).json
    assert len(big["payload"]) == PAYLOAD_PREVIEW_BYTES and big["payload_truncated"] is True
    assert app.call("GET", "/api/timers/t1?payload=0", READER).json["payload_shown"] is False

    refused = app.call("GET", "/api/timers/t1?payload=yes-please", READER)
    assert refused.status == 400 and "payload" in refused.json["error"]


@pytest.mark.parametrize("action", ["cancel", "reschedule"])
def test_a_read_token_cannot_change_timers(apps: dict[str, Served], action: str) -> None:
    reply = apps["both tokens"].call("POST", f"/api/timers/t1/{action}", READER)
    assert reply.status == 403
    assert "only reads" in reply.json["error"] and "TIMERS_ADMIN_TOKEN" in reply.json["error"]
    assert apps["both tokens"].call("POST", f"/api/timers/t1/{action}").status == 401
    assert apps["open reads"].call("POST", f"/api/timers/t1/{action}").status == 403


@pytest.mark.parametrize("path", FAUST_VIEWS)
def test_faust_views_are_not_served(apps: dict[str, Served], path: str) -> None:
    for config in ("admin token", "open reads"):
        assert apps[config].call("GET", path, ADMIN).status == 404


def test_the_server_routes_exactly_the_documented_paths(apps: dict[str, Served]) -> None:
    routed = {
        (route.method, route.resource.canonical)
        for route in cast(Any, apps["admin token"].app.web).web_app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    api = {(method.upper(), path) for path, ops in openapi.spec(4)["paths"].items() for method in ops}
    others = {("GET", path) for path in OPEN_ROUTES if not path.startswith("/api/")}
    assert routed == api | others


def test_a_metrics_port_serves_the_metrics_and_nothing_of_the_admin_api(
    tables: dict[int, PartitionTimers], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TIMERS_METRICS_PORT, Prometheus can be admitted to a port where no admin route is."""
    app = faust.App("web-metrics-test", broker="kafka://127.0.0.1:1")
    started: list[Any] = []
    monkeypatch.setattr(app, "add_dependency", started.append)  # started with the app
    config = WorkerConfig(admin_open_reads=True, metrics_port=9464)
    metrics = WorkerMetrics()
    metrics.scheduled.inc(7)
    brokers = BrokerWatch(config.common.kafka, config.common.topics.request)
    register_views(
        app, metrics, cast(Any, HeldTables(tables)), config, WorkerStatus(), cast(Any, None), brokers
    )
    (server,) = started
    assert isinstance(server, MetricsServer)
    # The same server on a free port of this machine, as the app would start it.
    server = MetricsServer(metrics, "127.0.0.1", 0)

    async def fetch_all() -> dict[str, tuple[int, str]]:
        await server.start()
        try:
            replies = {}
            async with aiohttp.ClientSession() as session:
                for path in ("/metrics", *TIMER_READS, *OPEN_ROUTES):
                    async with session.get(f"http://127.0.0.1:{server.port}{path}") as response:
                        replies[path] = (response.status, await response.text())
            return replies
        finally:
            await server.stop()

    loop = asyncio.new_event_loop()
    try:
        replies = loop.run_until_complete(fetch_all())
    finally:
        loop.close()
    status, text = replies.pop("/metrics")
    assert status == 200 and "timers_scheduled_total 7.0" in text
    assert {path: status for path, (status, _) in replies.items()} == {path: 404 for path in replies}


def test_without_a_metrics_port_there_is_no_second_server(monkeypatch: pytest.MonkeyPatch) -> None:
    app = faust.App("web-one-port-test", broker="kafka://127.0.0.1:1")
    started: list[Any] = []
    monkeypatch.setattr(app, "add_dependency", started.append)
    config = WorkerConfig()
    brokers = BrokerWatch(config.common.kafka, config.common.topics.request)
    store = cast(Any, HeldTables({}))
    register_views(app, WorkerMetrics(), store, config, WorkerStatus(), cast(Any, None), brokers)
    assert started == []


#: Every answer of the admin API, refusals included: timers, payloads, and what a token guards.
API_ANSWERS = (
    *((path, READER, 200) for path in TIMER_READS),
    *((path, None, 401) for path in TIMER_READS),
    ("/api/timers/no-such-timer", READER, 404),
    ("/api/timers/t1?payload=yes-please", READER, 400),
    *((path, None, 200) for path in OPEN_ROUTES if path.startswith("/api/")),
)


@pytest.mark.parametrize(("path", "token", "status"), API_ANSWERS)
def test_no_cache_keeps_an_answer_of_the_admin_api(
    apps: dict[str, Served], path: str, token: str | None, status: int
) -> None:
    """A browser or a proxy between the operator and the worker must not keep a payload, or
    what only a token may read, where the next user of the machine finds it."""
    reply = apps["both tokens"].call("GET", path, token)
    assert reply.status == status, reply.text
    assert reply.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("action", "token", "status"),
    [
        *(("cancel", token, status) for token, status in ((None, 401), (READER, 403), (ADMIN, 404))),
        *(("reschedule", token, status) for token, status in ((None, 401), (READER, 403), (ADMIN, 400))),
    ],
)
def test_no_cache_keeps_an_answer_to_a_mutation(
    apps: dict[str, Served], action: str, token: str | None, status: int
) -> None:
    reply = apps["both tokens"].call("POST", f"/api/timers/no-such-timer/{action}", token)
    assert reply.status == status, reply.text
    assert reply.headers["Cache-Control"] == "no-store"
