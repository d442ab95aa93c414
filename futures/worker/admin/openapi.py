"""The OpenAPI 3 description of the admin API, served at ``/api/openapi.json``.

Written by hand next to the views, and exact: every value it admits is one the views
take, every value it refuses they refuse (400), and a route takes only the query
parameters listed here. Tests check that it names exactly the routes the worker serves
(tests/worker/test_web.py) and fuzz each operation from it (tests/worker/admin/test_schema.py).
"""

from __future__ import annotations

from typing import Any

from futures.worker.admin.params import (
    CURSOR_PATTERN,
    DEFAULT_LIMIT,
    END_MS,
    FIRINGS_LIMIT,
    MAX_DELAY_S,
    MAX_DUE_MS,
    MAX_LIMIT,
)
from futures.worker.admin.queries import PAYLOAD_PREVIEW_BYTES

Json = dict[str, Any]


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _query(name: str, description: str, schema: Json) -> Json:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


#: Sent with every answer of the API (views.API_HEADERS): no cache keeps one.
_NO_STORE = {
    "Cache-Control": {
        "description": "Every answer: no browser or proxy keeps timers, payloads or what a token guards",
        "required": True,
        "schema": {"type": "string", "enum": ["no-store"]},
    }
}


def _json(description: str, schema: Json) -> Json:
    return {
        "description": description,
        "headers": _NO_STORE,
        "content": {"application/json": {"schema": schema}},
    }


_ERROR = _json("Refused; `error` says what to fix", _ref("Error"))
_ID = {
    "name": "timer_id",
    "in": "path",
    "required": True,
    "description": "Timer id (URL-encoded)",
    "schema": {"type": "string", "minLength": 1},
}
#: A due time: epoch ms up to the latest the ingest accepts (9999-12-31T23:59:59.999Z).
_MS = {"type": "integer", "format": "int64", "minimum": 0, "maximum": MAX_DUE_MS}
_NULLABLE_MS = {**_MS, "nullable": True}
#: A bound of a range of due times: up to just after the latest due time.
_RANGE_MS = {"type": "integer", "format": "int64", "minimum": 0, "maximum": END_MS}


def _limit(default: int) -> Json:
    schema = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": default}
    return _query("limit", "Page size", schema)


_READ_SECURITY: Json = {"security": [{"bearer": []}]}
_READ_ERRORS = {
    "401": _json("Missing or wrong bearer token", _ref("Error")),
    "403": _json(
        "Timer reads disabled: neither TIMERS_ADMIN_READ_TOKEN nor TIMERS_ADMIN_TOKEN is set on this worker",
        _ref("Error"),
    ),
}
_MUTATION_ERRORS = {
    "401": _json("Missing or wrong bearer token", _ref("Error")),
    "403": _json(
        "Mutations disabled (TIMERS_ADMIN_TOKEN is not set on this worker), or the token only reads",
        _ref("Error"),
    ),
    "404": _json("Not pending in the partitions this worker holds", _ref("NotHere")),
    "503": _json("Kafka did not acknowledge the request", _ref("Error")),
}


def _paths(partitions: int) -> Json:
    return {
        "/api/stats": {
            "get": {
                "summary": "Pending count, next due, firings and lateness, dead letters, clocks, oscillators",
                "responses": {"200": _json("Worker status", _ref("Stats")), "400": _ERROR},
            }
        },
        "/api/partitions": {
            "get": {
                "summary": "Pending count and clock of each partition held here; who holds the others",
                "responses": {
                    "200": _json(
                        "Partitions",
                        {
                            "type": "object",
                            "properties": {
                                "partitions": {"type": "array", "items": _ref("Partition")},
                                "elsewhere": _ref("Elsewhere"),
                            },
                        },
                    ),
                    "400": _ERROR,
                },
            }
        },
        "/api/timers": {
            "get": {
                "summary": "Pending timers due in [from_ms, to_ms), earliest first, one page at a time "
                "(none when to_ms <= from_ms)",
                "description": "A range scan over the table's due-time order, never a full scan. Covers the "
                "partitions this worker holds; `elsewhere` names the workers holding the others. "
                "Shows payload sizes, never payloads.",
                **_READ_SECURITY,
                "parameters": [
                    _query("from_ms", "Earliest due time, epoch ms (inclusive)", {**_RANGE_MS, "default": 0}),
                    _query(
                        "to_ms",
                        "End of the due times, epoch ms (exclusive); not before from_ms",
                        {**_RANGE_MS, "default": END_MS},
                    ),
                    _limit(DEFAULT_LIMIT),
                    _query(
                        "after",
                        "The `next` value of the previous page: a due time (epoch ms), `:`, a timer id",
                        {"type": "string", "pattern": CURSOR_PATTERN},
                    ),
                    _query(
                        "partition",
                        "Only this partition",
                        {"type": "integer", "minimum": 0, "maximum": partitions - 1},
                    ),
                ],
                "responses": {
                    "200": _json(
                        "One page",
                        {
                            "type": "object",
                            "properties": {
                                "timers": {"type": "array", "items": _ref("TimerSummary")},
                                "next": {
                                    "type": "string",
                                    "nullable": True,
                                    "description": "Pass as `after` for the next page; null on the last",
                                },
                                "partitions": {"type": "array", "items": {"type": "integer"}},
                                "elsewhere": _ref("Elsewhere"),
                            },
                        },
                    ),
                    "400": _ERROR,
                    **_READ_ERRORS,
                    "404": _json("The partition is held by another worker (`held_by`)", _ref("Error")),
                },
            }
        },
        "/api/timers/{timer_id}": {
            "get": {
                "summary": "One pending timer by id",
                "description": "Its payload and header values only with `payload=1`.",
                **_READ_SECURITY,
                "parameters": [
                    _ID,
                    _query(
                        "payload",
                        f"1: include the payload (its first {PAYLOAD_PREVIEW_BYTES} bytes) and header values",
                        {"type": "integer", "enum": [0, 1], "default": 0},
                    ),
                ],
                "responses": {
                    "200": _json("The timer", _ref("TimerDetail")),
                    "400": _ERROR,
                    **_READ_ERRORS,
                    "404": _json("Not pending in the partitions this worker holds", _ref("NotHere")),
                },
            }
        },
        "/api/timers/{timer_id}/cancel": {
            "post": {
                "summary": "Cancel a pending timer",
                "description": "Sends a `Cancel` to `timer-request` in the timer's partition, as a client "
                "would; `timer-events` records CANCELLED, or CANCEL_MISSED if it fired first.",
                "security": [{"bearer": []}],
                "parameters": [_ID],
                "responses": {
                    "202": _json("Cancel sent", _ref("Mutation")),
                    "400": _ERROR,
                    **_MUTATION_ERRORS,
                },
            }
        },
        "/api/timers/{timer_id}/reschedule": {
            "post": {
                "summary": "Move a pending timer to a new due time",
                "description": "Sends the stored `Future` again, all of it, with the same id and the new "
                "due time; the newer version replaces the pending one and `timer-events` records "
                "SCHEDULED. A recurring timer's pending occurrence moves, keeping its ordinal and its "
                "series' rule and limits; the occurrences after it follow from the new due time. The "
                "worker's own checks are applied first (due time, TIMERS_MAX_DUE_AHEAD_S, lateness "
                "policy, callback topic, size, recurrence): what it would refuse is not sent (409, "
                "with the dead-letter reason it would give).",
                "security": [{"bearer": []}],
                "parameters": [_ID],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "description": "Exactly one of due_ms (epoch ms) and delay_s (seconds "
                                "from now)",
                                "properties": {
                                    "due_ms": _MS,
                                    "delay_s": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S},
                                },
                                "additionalProperties": False,
                                "oneOf": [{"required": ["due_ms"]}, {"required": ["delay_s"]}],
                            }
                        }
                    },
                },
                "responses": {
                    "202": _json("Reschedule sent", _ref("Mutation")),
                    "400": _ERROR,
                    "409": _json(
                        "Not sent: the worker would refuse the timer due then (`reason`: its dead-letter "
                        "reason, e.g. invalid-recurrence for a due time outside its series' bounds)",
                        _ref("Refused"),
                    ),
                    "413": _json("Body too large", _ref("Error")),
                    **_MUTATION_ERRORS,
                },
            }
        },
        "/api/firings": {
            "get": {
                "summary": "Recent firings with their lateness, newest first (kept in memory, bounded)",
                **_READ_SECURITY,
                "parameters": [_limit(FIRINGS_LIMIT)],
                "responses": {
                    "200": _json(
                        "Firings",
                        {
                            "type": "object",
                            "properties": {"firings": {"type": "array", "items": _ref("Firing")}},
                        },
                    ),
                    "400": _ERROR,
                    **_READ_ERRORS,
                },
            }
        },
        "/api/timeline": {
            "get": {
                "summary": "Pending timers per bucket: next hour (1-minute buckets) or day (30-minute)",
                "parameters": [
                    _query(
                        "window",
                        "hour or day",
                        {"type": "string", "enum": ["hour", "day"], "default": "hour"},
                    )
                ],
                "responses": {"200": _json("Timeline", _ref("Timeline")), "400": _ERROR},
            }
        },
        "/api/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": _json("OpenAPI 3 JSON", {"type": "object"}), "400": _ERROR},
            }
        },
    }


def _schemas() -> Json:
    integer = {"type": "integer"}
    number = {"type": "number", "nullable": True}
    string = {"type": "string"}
    summary = {
        "id": string,
        "partition": integer,
        "due_ms": _MS,
        "callback_topic": string,
        "callback_key": string,
        "payload_bytes": integer,
    }
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": string}},
        "Refused": {
            "type": "object",
            "required": ["error", "reason"],
            "properties": {"error": string, "reason": string},
        },
        "Elsewhere": {
            "type": "object",
            "description": "Worker URL → partitions it holds, as Faust's partition assignor last saw them",
            "additionalProperties": {"type": "array", "items": integer},
        },
        "NotHere": {
            "type": "object",
            "properties": {
                "error": string,
                "partitions": {"type": "array", "items": integer, "description": "held by this worker"},
                "elsewhere": _ref("Elsewhere"),
            },
        },
        "TimerSummary": {"type": "object", "properties": summary},
        "TimerDetail": {
            "type": "object",
            "properties": {
                **summary,
                "payload_shown": {"type": "boolean", "description": "asked for with `payload=1`"},
                "payload": {
                    "type": "string",
                    "description": f"With `payload=1` only: the first {PAYLOAD_PREVIEW_BYTES} bytes of the "
                    "callback value",
                },
                "payload_encoding": {"type": "string", "enum": ["utf-8", "base64"]},
                "payload_truncated": {"type": "boolean"},
                "has_token": {"type": "boolean"},
                "series": {
                    "type": "object",
                    "description": "A recurring timer only: its rule, and its pending occurrence (due at "
                    "`due_ms`) and the one after",
                    "properties": {
                        "cron": {**string, "nullable": True},
                        "time_zone": {**string, "nullable": True},
                        "interval_ms": {**integer, "nullable": True},
                        "until_ms": {**integer, "nullable": True},
                        "max_count": {**integer, "nullable": True},
                        "occurrence": {
                            **integer,
                            "description": "ordinal of the pending occurrence (1: the first)",
                        },
                        "first_due_ms": _MS,
                        "following_due_ms": {
                            **integer,
                            "nullable": True,
                            "description": "the occurrence after the pending one; null when the series ends",
                        },
                    },
                },
                "headers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "key": string,
                            "value_bytes": integer,
                            "value": {**string, "description": "With `payload=1` only"},
                        },
                    },
                },
                "source_partition": integer,
                "source_offset": integer,
                "accepted_ms": integer,
            },
        },
        "Mutation": {
            "type": "object",
            "properties": {
                "id": string,
                "partition": integer,
                "due_ms": _MS,
                "previous_due_ms": _MS,
                "status": {"type": "string", "enum": ["cancel-sent", "reschedule-sent"]},
                "detail": string,
            },
        },
        "Firing": {
            "type": "object",
            "properties": {
                "id": string,
                "partition": integer,
                "due_ms": _MS,
                "fired_ms": _MS,
                "lateness_s": {"type": "number"},
            },
        },
        "Partition": {
            "type": "object",
            "properties": {
                "partition": integer,
                "pending": integer,
                "watermark_s": {**integer, "nullable": True, "description": "epoch second fired up to"},
                "clock_lag_s": number,
                "last_tick_s": {**integer, "nullable": True},
                "last_tick_age_s": number,
                "last_tick_source": {**string, "nullable": True},
                "stalled": {"type": "boolean"},
                "stall_reason": {**string, "nullable": True},
            },
        },
        "Oscillator": {
            "type": "object",
            "properties": {
                "source": string,
                "last_second": integer,
                "last_seen_ms": integer,
                "age_s": {"type": "number"},
                "ticks": integer,
                "stale": {"type": "boolean"},
            },
        },
        "Stats": {
            "type": "object",
            "properties": {
                "worker": {**string, "description": "this worker's web URL"},
                "ready": {"type": "boolean", "description": "assigned partitions recovered"},
                "timer_reads": {
                    "type": "string",
                    "enum": ["token", "open", "disabled"],
                    "description": "how timers are read here: with a bearer token, without one "
                    "(TIMERS_ADMIN_OPEN_READS), or not at all (no token configured)",
                },
                "mutations_enabled": {"type": "boolean"},
                "now_ms": integer,
                "pending": integer,
                "next_due_ms": _NULLABLE_MS,
                "fired_last_minute": integer,
                "lateness": {
                    "type": "object",
                    "description": "over the last 10,000 firings",
                    "properties": {"p50_s": number, "p99_s": number, "max_s": number, "samples": integer},
                },
                "dead_letters": {
                    "type": "object",
                    "description": "reason → count and last time, since the worker started",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"count": integer, "last_ms": integer},
                    },
                },
                "partitions": {"type": "array", "items": _ref("Partition")},
                "elsewhere": _ref("Elsewhere"),
                "oscillators": {"type": "array", "items": _ref("Oscillator")},
            },
        },
        "Timeline": {
            "type": "object",
            "properties": {
                "window": string,
                "start_ms": integer,
                "bucket_s": integer,
                "buckets": {"type": "array", "items": integer},
                "overdue": integer,
                "truncated": {"type": "boolean", "description": "more timers than were counted"},
            },
        },
    }


def spec(partitions: int) -> Json:
    """The document for a worker whose topics have ``partitions`` partitions."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "kafka-timers worker admin API",
            "version": "1",
            "description": "Served by each futures worker for the partitions it holds. Counts and clocks "
            "(stats, partitions, timeline) answer whoever reaches the port, like /metrics. Timers "
            "themselves (list, one timer, firings) need `Authorization: Bearer <token>` with "
            "TIMERS_ADMIN_READ_TOKEN or TIMERS_ADMIN_TOKEN (unless TIMERS_ADMIN_OPEN_READS=1); "
            "cancel and reschedule need TIMERS_ADMIN_TOKEN. Times: epoch ms (`*_ms`) or seconds (`*_s`).",
        },
        "paths": _paths(partitions),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
