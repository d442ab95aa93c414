"""HTTP endpoints on the Faust web server: metrics, health, and the admin API and page.

The worker serves these and nothing else (docs/admin.md lists every route and who
may call it). Faust's own views — ``/router/`` (partition assignment, every
worker's URL), ``/table/`` (table contents by key), ``/`` and the debug ones —
are never registered. With ``TIMERS_METRICS_PORT``, ``/metrics`` is also served
alone on that port, so that a network policy can let Prometheus reach the metrics
without reaching the admin API.
"""

from __future__ import annotations

from typing import Any

import faust
from aiohttp import web as aioweb
from faust.web.base import BlueprintManager
from mode import Service
from prometheus_client import CONTENT_TYPE_LATEST

from futures.worker.admin.actions import TimerActions
from futures.worker.admin.views import register_admin
from futures.worker.brokers import BrokerWatch
from futures.worker.config import WorkerConfig
from futures.worker.kafka import KafkaWriter
from futures.worker.metrics import WorkerMetrics
from futures.worker.status import WorkerStatus
from futures.worker.store import TimerStore


def register_views(
    app: faust.App,
    metrics: WorkerMetrics,
    store: TimerStore,
    config: WorkerConfig,
    status: WorkerStatus,
    writer: KafkaWriter,
    brokers: BrokerWatch,
) -> None:
    """``/metrics`` (Prometheus), ``/healthz`` (liveness: the event loop answers, whatever the
    brokers do), ``/readyz`` (readiness: partitions assigned, their tables recovered and the
    brokers reachable), and the admin API (``/api/...``) and page (``/admin/``), see
    :mod:`futures.worker.admin`."""
    without_builtin_views(app)

    @app.page("/metrics")
    async def metrics_view(web: Any, request: Any) -> Any:
        return web.bytes(metrics.render(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/healthz")
    async def health_view(web: Any, request: Any) -> Any:
        return web.json({"status": "ok"})

    @app.page("/readyz")
    async def ready_view(web: Any, request: Any) -> Any:
        partitions = sorted(store.open_partitions())
        if not brokers.reachable:
            return web.json(
                {"status": "brokers unreachable", "reason": brokers.reason, "partitions": partitions},
                status=503,
            )
        if store.ready:
            return web.json({"status": "ready", "partitions": partitions})
        return web.json({"status": "recovering", "partitions": partitions}, status=503)

    # The admin API's cancel/reschedule requests go out on the worker's own producer.
    register_admin(app, config, store, status, TimerActions(config, writer))
    if config.metrics_port is not None:
        app.add_dependency(MetricsServer(metrics, config.web_host, config.metrics_port))


class MetricsServer(Service):
    """``GET /metrics`` and nothing else, on a port of its own.

    It runs on the worker's event loop, like the web port's views: the table collectors
    read RocksDB from that loop only, never from a thread of their own.
    """

    def __init__(self, metrics: WorkerMetrics, host: str, port: int, **kwargs: Any) -> None:
        self._metrics = metrics
        self._host = host
        self._port = port
        self._runner: aioweb.AppRunner | None = None
        super().__init__(**kwargs)

    @property
    def port(self) -> int:
        """The bound TCP port (useful when started with port 0)."""
        if self._runner is None:
            raise RuntimeError("the metrics server has not started")
        return int(self._runner.addresses[0][1])

    async def on_start(self) -> None:
        server = aioweb.Application()
        server.router.add_get("/metrics", self._serve)
        runner = aioweb.AppRunner(server, access_log=None)
        await runner.setup()
        await aioweb.TCPSite(runner, self._host, self._port).start()
        self._runner = runner

    async def on_stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def without_builtin_views(app: faust.App) -> None:
    """Keep Faust from registering its own views when the web server starts.

    Faust applies the blueprints of ``app.web.blueprints`` (its router, table and
    index views, and the debug ones its settings switch on) in ``init_server``,
    after our views are added. An empty manager there means none of them is ever
    routed: each of their paths is a plain 404, not a view of ours in their way.
    """
    if app.web.blueprints.applied:
        raise RuntimeError("the web server has started: Faust's own views are already routed")
    app.web.blueprints = BlueprintManager()
