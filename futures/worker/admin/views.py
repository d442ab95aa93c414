"""The admin API and page as Faust web views (aiohttp, on the worker's web port).

Reads answer from the partitions this worker holds and name the worker holding
the others (Faust's partition assignor knows every member's web URL). Who may call
what (docs/admin.md):

- counts and clocks (``/api/stats``, ``/api/partitions``, ``/api/timeline``), the
  spec and the page's files: whoever reaches the port, like ``/metrics``;
- timers themselves (``/api/timers``, ``/api/timers/{id}``, ``/api/firings``): a
  bearer token, TIMERS_ADMIN_READ_TOKEN or TIMERS_ADMIN_TOKEN, unless
  TIMERS_ADMIN_OPEN_READS opens them; with neither token set they are refused (403);
- cancel and reschedule: ``Authorization: Bearer <TIMERS_ADMIN_TOKEN>`` only.

Every bad input is a 4xx JSON ``{"error": ...}`` saying what to fix. See
``openapi.py`` for the contract.
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
from futures.worker.admin.actions import Refused, TimerActions
from futures.worker.admin.params import FIRINGS_LIMIT, ApiError
from futures.worker.admin.queries import Holding, Json
from futures.worker.config import WorkerConfig
from futures.worker.status import WorkerStatus
from futures.worker.store import TimerStore
from ktimers.config import Secret
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
#: Every answer of the API, refusals included: it may hold timers, a payload, or what a token
#: guards, none of which a browser or a proxy may keep for the next user of the machine.
API_HEADERS = {"Cache-Control": "no-store"}
_STATIC = {"app.js": "application/javascript", "style.css": "text/css", "favicon.svg": "image/svg+xml"}

Result = tuple[int, Any]

READS_DISABLED = (
    "reading timers is disabled on this worker: set TIMERS_ADMIN_READ_TOKEN (reads only) or "
    "TIMERS_ADMIN_TOKEN (reads, cancel and reschedule), 16+ random characters, in its environment and "
    "restart it; or TIMERS_ADMIN_OPEN_READS=1 to let whoever reaches this port read them without a token"
)
MUTATIONS_DISABLED = (
    "cancel and reschedule are disabled on this worker: "
    "set TIMERS_ADMIN_TOKEN (16+ random characters) in its environment and restart it"
)


def _bearer(authorization: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for any other header."""
    scheme, _, given = (authorization or "").partition(" ")
    return given.strip().encode() if scheme.lower() == "bearer" else None


def _is(given: bytes | None, token: Secret | None) -> bool:
    if given is None or token is None:
        return False
    return hmac.compare_digest(given, token.get_secret_value().encode())


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
            "timer_reads": self.timer_reads,
            "mutations_enabled": self.config.admin_token is not None,
        }

    @property
    def timer_reads(self) -> str:
        """How timers are read here: ``open``, with a ``token``, or ``disabled`` (no token set)."""
        if self.config.admin_open_reads:
            return "open"
        configured = self.config.admin_token or self.config.admin_read_token
        return "token" if configured else "disabled"

    def partitions(self) -> Json:
        holding = self.holding()
        return {
            "partitions": queries.partitions_json(holding, self.status, self.config.admin_stall_after_s),
            "elsewhere": holding.elsewhere_json(),
        }

    def timer(self, raw_id: str, query: dict[str, str]) -> Json:
        with_payload = params.flag(query, "payload")
        return queries.detail_json(self._find(self.holding(), raw_id), with_payload)

    def timers(self, query: dict[str, str]) -> Json:
        holding = self.holding()
        from_ms = params.epoch_ms(query, "from_ms", 0)
        to_ms = params.epoch_ms(query, "to_ms", params.END_MS)
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
        return {"firings": queries.firings_json(self.status, params.limit(query, default=FIRINGS_LIMIT))}

    def timeline(self, query: dict[str, str]) -> Json:
        window = params.choice(query, "window", tuple(queries.TIMELINE_WINDOWS))
        return queries.timeline_json(self.holding().tables, self.status.now_ms(), window)

    # -- who may -----------------------------------------------------------------

    def authorize_read(self, authorization: str | None) -> None:
        """Refuse a read of timers unless reads are open or the header carries a token that reads."""
        reads = self.timer_reads
        if reads == "open":
            return
        if reads == "disabled":
            raise ApiError(403, READS_DISABLED)
        given = _bearer(authorization)
        # Both compared, whichever matches: the time taken does not say which token it was.
        admin, reader = _is(given, self.config.admin_token), _is(given, self.config.admin_read_token)
        if not (admin or reader):
            raise ApiError(
                401,
                "missing or wrong token: send the header 'Authorization: Bearer <token>' with "
                "TIMERS_ADMIN_READ_TOKEN or TIMERS_ADMIN_TOKEN",
            )

    def authorize(self, authorization: str | None) -> None:
        """Refuse a mutation unless the header carries the admin token."""
        if self.config.admin_token is None:
            raise ApiError(403, MUTATIONS_DISABLED)
        given = _bearer(authorization)
        admin, reader = _is(given, self.config.admin_token), _is(given, self.config.admin_read_token)
        if admin:
            return
        if reader:
            raise ApiError(403, "this token only reads: cancel and reschedule need TIMERS_ADMIN_TOKEN")
        raise ApiError(
            401, "missing or wrong token: send the header 'Authorization: Bearer <TIMERS_ADMIN_TOKEN>'"
        )

    # -- mutations ---------------------------------------------------------------

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
        now_ms = self.status.now_ms()
        due = params.reschedule_body(body, now_ms)
        located = self._find(self.holding(), raw_id)
        try:
            await self.actions.reschedule(located.timer, located.partition, due.due_ms, now_ms)
        except Refused as exc:
            refused = f"not sent: the worker would refuse this timer due at {due.due_ms}"
            raise ApiError(409, f"{refused} ({exc.reason}: {exc.detail})", reason=exc.reason) from exc
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
        headers = dict(API_HEADERS)
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="kafka-timers admin"'
        return web.json({"error": exc.message, **exc.extra}, status=exc.status, headers=headers)
    except TimersError as exc:
        log.warning("admin request failed: %s", exc)
        body = {"error": f"Kafka did not take the request: {exc}"}
        return web.json(body, status=503, headers=dict(API_HEADERS))
    return web.json(body, status=status, headers=dict(API_HEADERS))


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
    spec = openapi.spec(config.common.topics.partitions)

    def query_of(request: Any, path: str, method: str) -> dict[str, str]:
        """The query of a request to ``path``: only the parameters its operation lists."""
        query = _query(request)
        operation = spec["paths"][path][method]
        params.only(query, tuple(p["name"] for p in operation.get("parameters", ()) if p["in"] == "query"))
        return query

    Answer = Callable[[dict[str, str], dict[str, str]], Json]

    def read(path: str, answer: Answer, timers: bool = False) -> None:
        """A GET view answering ``answer(query, path parameters)``; ``timers``: it shows
        timers themselves, so it takes a token that reads (see ``AdminApi.authorize_read``)."""

        class Read(View):
            async def get(self, request: Any, **match: str) -> Any:
                async def run() -> Result:
                    if timers:
                        api.authorize_read(request.headers.get("Authorization"))
                    return 200, answer(query_of(request, path, "get"), match)

                return await _answer(self.web, run)

        app.page(path, name=f"admin-api{path}")(Read)

    read("/api/openapi.json", lambda query, match: spec)
    read("/api/stats", lambda query, match: api.stats())
    read("/api/partitions", lambda query, match: api.partitions())
    read("/api/timeline", lambda query, match: api.timeline(query))
    read("/api/timers", lambda query, match: api.timers(query), timers=True)
    read("/api/timers/{timer_id}", lambda query, match: api.timer(match["timer_id"], query), timers=True)
    read("/api/firings", lambda query, match: api.firings(query), timers=True)

    @app.page("/api/timers/{timer_id}/cancel", name="admin_cancel")
    class Cancel(View):
        async def post(self, request: Any, timer_id: str) -> Any:
            async def run() -> Result:
                api.authorize(request.headers.get("Authorization"))
                query_of(request, "/api/timers/{timer_id}/cancel", "post")
                return 202, await api.cancel(timer_id)

            return await _answer(self.web, run)

    @app.page("/api/timers/{timer_id}/reschedule", name="admin_reschedule")
    class Reschedule(View):
        async def post(self, request: Any, timer_id: str) -> Any:
            async def run() -> Result:
                api.authorize(request.headers.get("Authorization"))
                query_of(request, "/api/timers/{timer_id}/reschedule", "post")
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
