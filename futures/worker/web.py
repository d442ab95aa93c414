"""HTTP endpoints on the Faust web server: metrics, health, and the admin API and page.

The worker serves these and nothing else (docs/admin.md lists every route and who
may call it). Faust's own views — ``/router/`` (partition assignment, every
worker's URL), ``/table/`` (table contents by key), ``/`` and the debug ones —
are never registered.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.web.base import BlueprintManager
from prometheus_client import CONTENT_TYPE_LATEST

from futures.worker.admin.actions import TimerActions
from futures.worker.admin.views import register_admin
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
) -> None:
    """``/metrics`` (Prometheus), ``/healthz`` (liveness: the event loop answers),
    ``/readyz`` (readiness: partitions assigned and their tables recovered), and the
    admin API (``/api/...``) and page (``/admin/``), see :mod:`futures.worker.admin`."""
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
        if store.ready:
            return web.json({"status": "ready", "partitions": partitions})
        return web.json({"status": "recovering", "partitions": partitions}, status=503)

    # The admin API's cancel/reschedule requests go out on the worker's own producer.
    register_admin(app, config, store, status, TimerActions(config, writer))


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
