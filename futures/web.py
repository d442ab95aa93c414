"""HTTP endpoints on the Faust web server: metrics and health."""

from __future__ import annotations

from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST

from futures.metrics import WorkerMetrics
from futures.store import TimerStore


def register_views(app: faust.App, metrics: WorkerMetrics, store: TimerStore) -> None:
    """``/metrics`` (Prometheus), ``/healthz`` (liveness: the event loop answers) and
    ``/readyz`` (readiness: partitions assigned and their tables recovered)."""

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
