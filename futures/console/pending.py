"""Pending timers over all workers: ``timers list`` and ``timers show`` through the admin API.

A listing asks every worker for one page of the timers it holds, due in the range asked,
and merges them by (due time, id): the order of the workers' table keys, so the cursor
``<due ms>:<id>`` of the last timer resumes the merged listing on every worker alike.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from futures.console.admin import AdminApi, AdminError, Answer, Json, elsewhere


@dataclass(frozen=True)
class Page:
    timers: list[Json]
    #: Pass back as ``--after`` for the next page; None on the last one.
    next: str | None
    workers: list[str]
    #: Partitions no answering worker holds (their timers are not in the page).
    missing: list[int]


def _items(body: Json, name: str) -> list[Any]:
    found = body.get(name)
    return found if isinstance(found, list) else []


def _held(body: Json) -> set[int]:
    return {p for p in _items(body, "partitions") if type(p) is int}


def _timers(answer: Answer) -> list[Json]:
    """The timers of a listing; :class:`AdminError` for one without an id and a due time,
    which a worker of this version never sends."""
    timers = _items(answer.body, "timers")
    for item in timers:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("id"), str)
            and type(item.get("due_ms")) is int
            and type(item.get("partition", 0)) is int
        ):
            raise AdminError(
                f"{answer.url} listed a timer without an id and a due time: is it a worker of this version?"
            )
    return timers


def list_timers(client: AdminApi, query: Mapping[str, object], limit: int, partitions: int) -> Page:
    """One page of at most ``limit`` pending timers over every worker, earliest first.

    ``query``: the ``/api/timers`` parameters besides ``limit`` (``from_ms``, ``to_ms``,
    ``after``, ``partition``); ``partitions``: how many the request topic has, to name those
    no worker answered for.
    """
    answers = _listing_answers(client, {**query, "limit": limit})
    timers: list[Json] = []
    held: set[int] = set()
    more = False
    for answer in answers:
        timers += _timers(answer)
        held |= _held(answer.body)
        more = more or answer.body.get("next") is not None
    timers.sort(key=lambda t: (t["due_ms"], t["id"], t.get("partition", 0)))
    page = timers[:limit]
    more = more or len(timers) > limit
    cursor = f"{page[-1]['due_ms']}:{page[-1]['id']}" if more and page else None
    wanted = {query["partition"]} if "partition" in query else set(range(partitions))
    return Page(
        page, cursor, [a.url for a in answers], sorted(p for p in wanted - held if isinstance(p, int))
    )


def _listing_answers(client: AdminApi, query: Mapping[str, object]) -> list[Answer]:
    if "partition" not in query:
        return list(client.each("/api/timers", _held, query))
    # One partition: the worker asked first names the one holding it, if it does not.
    answer = client.read(client.url, "/api/timers", query, found=(200, 404))
    if answer.status == 404:
        holder = answer.body.get("held_by")
        if not isinstance(holder, str):
            raise AdminError(
                f"partition {query['partition']} is held by no worker now: {answer.body.get('error')}"
            )
        answer = client.read(holder.rstrip("/"), "/api/timers", query)
    return [answer]


def show_timer(client: AdminApi, timer_id: str, payload: bool) -> Json | None:
    """One pending timer as the worker holding it describes it, with ``worker`` (its URL);
    None when no worker holds it."""
    path = "/api/timers/" + urllib.parse.quote(timer_id, safe="")
    query = {"payload": 1 if payload else 0}
    first = client.read(client.url, path, query, found=(200, 404))
    if first.status == 200:
        return {**first.body, "worker": first.url}
    # Asked in turn, not followed further: a worker names every other one.
    for url in sorted(elsewhere(first.body)):
        try:
            answer = client.read(url, path, query, found=(200, 404))
        except AdminError as exc:
            client.unreachable[url] = str(exc)
            continue
        if answer.status == 200:
            return {**answer.body, "worker": answer.url}
    return None


def detail_lines(timer: Mapping[str, Any]) -> list[tuple[str, object]]:
    """A timer's fields in the order people read them, for ``timers show``."""
    lines: list[tuple[str, object]] = [
        (name, timer.get(name))
        for name in (
            "id",
            "due_ms",
            "callback_topic",
            "callback_key",
            "payload_bytes",
            "has_token",
            "partition",
            "worker",
            "source_partition",
            "source_offset",
            "accepted_ms",
        )
    ]
    headers = timer.get("headers")
    if isinstance(headers, list):
        for header in headers:
            if isinstance(header, dict):
                shown = header.get("value", f"({header.get('value_bytes')} bytes)")
                lines.append((f"header {header.get('key')}", shown))
    series = timer.get("series")
    if isinstance(series, dict):
        lines += [(f"series {k}", v) for k, v in series.items() if v is not None]
    if timer.get("payload_shown"):
        lines.append(("payload", timer.get("payload")))
        lines.append(("payload_encoding", timer.get("payload_encoding")))
    return lines
