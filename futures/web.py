"""HTTP endpoints on the Faust web server: metrics and health."""

from __future__ import annotations

from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST

from futures.metrics import WorkerMetrics


def register_views(app: faust.App, metrics: WorkerMetrics) -> None:
    @app.page("/metrics")
    async def metrics_view(web: Any, request: Any) -> Any:
        return web.bytes(metrics.render(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/healthz")
    async def health_view(web: Any, request: Any) -> Any:
        return web.json({"status": "ok"})
