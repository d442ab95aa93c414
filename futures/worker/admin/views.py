"""The admin API and page as Faust web views (aiohttp, on the worker's web port).

Reads answer from the partitions this worker holds and name the worker holding
the others (Faust's partition assignor knows every member's web URL). Mutations
(cancel, reschedule) need ``Authorization: Bearer <TIMERS_ADMIN_TOKEN>``; without
a configured token they are refused with 403. Every bad input is a 4xx JSON
``{"error": ...}`` saying what to fix. See ``openapi.py`` for the contract.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import faust
from faust.web import View

from futures.worker.admin import openapi, params, queries
from futures.worker.admin.actions import TimerActions
from futures.worker.admin.params import ApiError
from futures.worker.admin.queries import Holding, Json
from futures.worker.config import WorkerConfig
from futures.worker.status import WorkerStatus
from futures.worker.store import TimerStore
from ktimers.errors import TimersError

log = logging.getLogger(__name__)

#: Request bodies are tiny JSON objects; anything larger is refused before parsing.
MAX_BODY_BYTES = 16 * 1024
#: The page loads only its own files and talks only to this worker, and is never framed
#: (a framed page could be tricked into a cancel).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
_STATIC = {"app.js": "application/javascript", "style.css": "text/css", "favicon.svg": "image/svg+xml"}

Result = tuple[int, Any]


@dataclass
class AdminApi:
    """What the views answer with; the Faust views below only translate HTTP to and from it."""

    app: faust.App
    config: WorkerConfig
    store: TimerStore
    status: WorkerStatus
    actions: TimerActions

    # -- who holds what ----------------------------------------------------------

    def holding(self) -> Holding:
        tables = {p: t for p, t in self.store.open_partitions().items() if self.store.owns(p)}
        topic = self.config.changelog_topic
        me = str(self.app.conf.canonical_url)
        elsewhere: dict[int, str] = {}
        try:
            distribution = self.app.assignor.table_metadata(topic)
        except Exception:  # noqa: BLE001 - no assignment yet (starting, rebalancing): say nothing
            distribution = {}
        for url, topics in distribution.items():
            if url == me:
                continue
            for partition in topics.get(topic, ()):
                if partition not in tables:
                    elsewhere[int(partition)] = str(url)
        return Holding(tables, elsewhere)

    def _not_here(self, holding: Holding, what: str) -> ApiError:
        held = sorted(holding.tables)
        return ApiError(
            404,
            f"{what} is not pending in the partitions this worker holds ({held})",
            partitions=held,
            elsewhere=holding.elsewhere_json(),
        )

    def _find(self, holding: Holding, raw_id: str) -> queries.Located:
        timer_id = params.timer_id(raw_id)
        located = queries.find(holding.tables, timer_id)
        if located is None:
            raise self._not_here(holding, f"timer {timer_id!r}")
        return located

    # -- reads -------------------------------------------------------------------

    def stats(self) -> Json:
        return {
            "worker": str(self.app.conf.canonical_url),
            "ready": self.store.ready,
            **queries.stats_json(self.holding(), self.status, self.config.admin_stall_after_s),
            "mutations_enabled": self.config.admin_token is not None,
        }

    def partitions(self) -> Json:
        holding = self.holding()
        return {
            "partitions": queries.partitions_json(holding, self.status, self.config.admin_stall_after_s),
            "elsewhere": holding.elsewhere_json(),
        }

    def timer(self, raw_id: str) -> Json:
        return queries.detail_json(self._find(self.holding(), raw_id))

    def timers(self, query: dict[str, str]) -> Json:
        holding = self.holding()
        from_ms = params.epoch_ms(query, "from_ms", 0)
        to_ms = params.epoch_ms(query, "to_ms", params.MAX_DUE_MS)
        if to_ms < from_ms:
            raise ApiError(400, f"to_ms={to_ms} is before from_ms={from_ms}")
        limit = params.limit(query)
        after = params.cursor(query)
        tables = holding.tables
        partition = params.partition(query, self.config.common.topics.partitions)
        if partition is not None:
            if partition not in tables:
                where = holding.elsewhere.get(partition)
                raise ApiError(
                    404,
                    f"partition {partition} is not held by this worker"
                    + (f": ask {where}" if where else " (no worker holds it now)"),
                    held_by=where,
                )
            tables = {partition: tables[partition]}
        page, cursor = queries.list_range(tables, from_ms, to_ms, after, limit)
        return {
            "timers": [queries.summary_json(located) for located in page],
            "next": cursor.encode() if cursor else None,
            "partitions": sorted(tables),
            "elsewhere": holding.elsewhere_json() if partition is None else {},
        }

    def firings(self, query: dict[str, str]) -> Json:
        return {"firings": queries.firings_json(self.status, params.limit(query, default=50))}

    def timeline(self, query: dict[str, str]) -> Json:
        window = params.choice(query, "window", tuple(queries.TIMELINE_WINDOWS))
        return queries.timeline_json(self.holding().tables, self.status.now_ms(), window)

    # -- mutations ---------------------------------------------------------------

    def authorize(self, authorization: str | None) -> None:
        token = self.config.admin_token
        if token is None:
            raise ApiError(
                403,
                "cancel and reschedule are disabled on this worker: "
                "set TIMERS_ADMIN_TOKEN (16+ random characters) in its environment and restart it",
            )
        scheme, _, given = (authorization or "").partition(" ")
        expected = token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise ApiError(
                401, "missing or wrong token: send the header 'Authorization: Bearer <TIMERS_ADMIN_TOKEN>'"
            )

    async def cancel(self, raw_id: str) -> Json:
        located = self._find(self.holding(), raw_id)
        await self.actions.cancel(located.due.timer_id, located.partition)
        return {
            "id": located.due.timer_id,
            "partition": located.partition,
            "due_ms": located.due.due_ms,
            "status": "cancel-sent",
            "detail": f"a Cancel is on {self.config.common.topics.request}[{located.partition}]; "
            f"{self.config.common.topics.events} records CANCELLED (or CANCEL_MISSED if it fired first)",
        }

    async def reschedule(self, raw_id: str, body: object) -> Json:
        due = params.reschedule_body(body, self.status.now_ms())
        located = self._find(self.holding(), raw_id)
        try:
            await self.actions.reschedule(located.timer, located.partition, due.due_ms)
        except ValueError as exc:
            raise ApiError(409, f"this timer cannot be sent again as stored: {exc}") from exc
        return {
            "id": located.due.timer_id,
            "partition": located.partition,
            "previous_due_ms": located.due.due_ms,
            "due_ms": due.due_ms,
            "status": "reschedule-sent",
            "detail": f"{self.config.common.topics.events} records SCHEDULED with the new due time",
        }


async def _answer(web: Any, handle: Callable[[], Awaitable[Result]]) -> Any:
    """Run a handler; turn what it raises into a JSON error with the right status."""
    try:
        status, body = await handle()
    except ApiError as exc:
        headers = {"WWW-Authenticate": 'Bearer realm="kafka-timers admin"'} if exc.status == 401 else None
        return web.json({"error": exc.message, **exc.extra}, status=exc.status, headers=headers)
    except TimersError as exc:
        log.warning("admin request failed: %s", exc)
        return web.json({"error": f"Kafka did not take the request: {exc}"}, status=503)
    return web.json(body, status=status)


def _query(request: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in request.query.items()}


async def _json_body(request: Any) -> object:
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc


def _static(name: str) -> bytes:
    return resources.files("futures.worker.admin").joinpath("static", name).read_bytes()


def register_admin(
    app: faust.App,
    config: WorkerConfig,
    store: TimerStore,
    status: WorkerStatus,
    actions: TimerActions,
) -> AdminApi:
    """Add the admin API (``/api/...``) and page (``/admin/``) to the worker's web server."""
    api = AdminApi(app, config, store, status, actions)
    spec = openapi.spec()

    def read(path: str, answer: Callable[[Any, dict[str, str]], Json]) -> None:
        """A GET view answering ``answer(request, path parameters)``."""

        class Read(View):
            async def get(self, request: Any, **match: str) -> Any:
                async def run() -> Result:
                    return 200, answer(request, match)

                return await _answer(self.web, run)

        app.page(path, name=f"admin-api{path}")(Read)

    read("/api/openapi.json", lambda request, match: spec)
    read("/api/stats", lambda request, match: api.stats())
    read("/api/partitions", lambda request, match: api.partitions())
    read("/api/timers", lambda request, match: api.timers(_query(request)))
    read("/api/timers/{timer_id}", lambda request, match: api.timer(match["timer_id"]))
    read("/api/firings", lambda request, match: api.firings(_query(request)))
    read("/api/timeline", lambda request, match: api.timeline(_query(request)))

    @app.page("/api/timers/{timer_id}/cancel", name="admin_cancel")
    class Cancel(View):
        async def post(self, request: Any, timer_id: str) -> Any:
            async def run() -> Result:
                api.authorize(request.headers.get("Authorization"))
                return 202, await api.cancel(timer_id)

            return await _answer(self.web, run)

    @app.page("/api/timers/{timer_id}/reschedule", name="admin_reschedule")
    class Reschedule(View):
        async def post(self, request: Any, timer_id: str) -> Any:
            async def run() -> Result:
                api.authorize(request.headers.get("Authorization"))
                return 202, await api.reschedule(timer_id, await _json_body(request))

            return await _answer(self.web, run)

    def serve(path: str, body: bytes, content_type: str) -> None:
        class Static(View):
            async def get(self, request: Any) -> Any:
                return self.web.bytes(body, content_type=content_type, headers=dict(PAGE_HEADERS))

        app.page(path, name=f"admin-page{path}")(Static)

    page = _static("index.html")
    serve("/admin", page, "text/html")
    serve("/admin/", page, "text/html")
    for name, content_type in _STATIC.items():
        serve(f"/admin/{name}", _static(name), content_type)

    return api
