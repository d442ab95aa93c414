"""The worker's admin API served live on 127.0.0.1, with a real engine behind it.

Faust's aiohttp driver serves the worker's views exactly as in a worker, on a thread
of its own; behind them a real :class:`TimerEngine` (tests/worker/rig.py) on RocksDB
tables under ``tmp_path``, whose clock is the API's too. What the API sends to
`timer-request` is handed to that engine by :meth:`LiveApi.apply_sent`, which says
whether the worker took it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust
from aiohttp.test_utils import TestServer

from futures.worker.brokers import BrokerWatch
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import WorkerStatus
from futures.worker.table import table_key
from futures.worker.web import register_views
from ktimers.config import BrokerProfile, Secret
from ktimers.wire import Future, Header, Recurrence, StoredTimer, TimerEvent
from tests.worker.rig import T_MS, Rig, new_rig

ADMIN = "admin-token-0123456789"
#: The series: every minute, five occurrences, the third pending.
SERIES_FIRST_MS = T_MS
SERIES_DUE_MS = T_MS + 120_000


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


#: Timers the tests point at, as stored when the worker accepted them: one plain, and a
#: series (every minute, five occurrences) at its third occurrence.
KNOWN = {
    "plain": Future(
        callBackTopic="orders",
        callBackKey="key-plain",
        callBack=b"hello",
        id="plain",
        due_ms=T_MS + 3_600_000,
        headers=[Header(key="h", value=b"v")],
    ),
    "series": Future(
        callBackTopic="orders",
        callBackKey="series-key",
        callBack=b"tick",
        id="series",
        due_ms=SERIES_DUE_MS,
        recurrence=Recurrence(interval_ms=60_000, max_count=5, ordinal=3, first_due_ms=SERIES_FIRST_MS),
    ),
}


class HeldTables:
    """The part of TimerStore the views read: the rig's tables, all recovered."""

    ready = True

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def open_partitions(self) -> dict[int, Any]:
        return dict(self.rig.tables)

    def owns(self, partition: int) -> bool:
        return partition in self.rig.owned


class LiveApi:
    """The worker's web server on its own thread and event loop, a real engine behind it."""

    def __init__(self, directory: Path, **settings: object) -> None:
        self.rig = new_rig(directory, BrokerProfile.CLUSTER, admin_token=Secret(ADMIN), **settings)
        self.restore()
        app = faust.App("schema-test", broker="kafka://127.0.0.1:1")
        writer = KafkaWriter(cast(Any, self.rig.producer), self.rig.config.max_record_bytes)
        status = WorkerStatus(clock=lambda: self.rig.now)
        store = cast(Any, HeldTables(self.rig))
        common = self.rig.config.common
        brokers = BrokerWatch(common.kafka, common.topics.request)
        register_views(app, WorkerMetrics(), store, self.rig.config, status, writer, brokers)
        app.web.init_server()
        self.loop = asyncio.new_event_loop()
        self.server = TestServer(cast(Any, app.web).web_app, host="127.0.0.1")
        self.loop.run_until_complete(self.server.start_server())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.base_url = str(self.server.make_url(""))
        self.requests_seen = 0

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        self.rig.close()

    def restore(self) -> None:
        """Store each known timer that is not pending (at the start, or after a cancel), as the
        worker stored it when it accepted it: under the limits of then, maybe not today's."""
        table = self.rig.table(0)
        for timer_id, future in KNOWN.items():
            if all(t.due_of(timer_id) is None for t in self.rig.tables.values()):
                stored = StoredTimer(future=future, accepted_ms=self.rig.now)
                table.apply([(table_key(future.due_ms, timer_id), stored.SerializeToString())], offset=None)

    def apply_sent(self) -> None:
        """Hand the engine what the API sent to `timer-request`; it must take every record."""
        request_topic = self.rig.topics.request
        sent = [s for s in self.rig.producer.sent[self.requests_seen :] if s.topic == request_topic]
        self.requests_seen = len(self.rig.producer.sent)
        for record in sent:
            rejected_before = (len(self.rig.dlq()), len(self.rig.events(TimerEvent.REJECTED)))
            self.rig.ingest(
                self.rig.raw_request(record.key, record.value, tuple(record.headers), record.partition or 0)
            )
            self.requests_seen = len(self.rig.producer.sent)
            rejected = (len(self.rig.dlq()), len(self.rig.events(TimerEvent.REJECTED)))
            assert rejected == rejected_before, f"answered 202, yet the worker refused: {self.rig.dlq()}"
            timer_id = Future.FromString(record.value or b"").id if record.value else ""
            if timer_id == "series":
                assert self.stored("series").future.HasField("recurrence"), "the series lost its rule"

    def stored(self, timer_id: str) -> StoredTimer:
        for table in self.rig.tables.values():
            due = table.due_of(timer_id)
            if due is not None:
                value = table.get(due, timer_id)
                assert value is not None
                return StoredTimer.FromString(value)
        raise AssertionError(f"{timer_id} is not pending")

    def call(self, method: str, path: str, body: object = None, token: str | None = ADMIN) -> Reply:
        """One request, as a client would send it (urllib); the body as JSON."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - http to our own server
            self.base_url + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our own server
                raw, status, got = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            raw, status, got = exc.read(), exc.code, dict(exc.headers)
        return Reply(status, json.loads(raw), got)
