"""The JSON countdown format of the Redis "black box" delay service.

Value (UTF-8 JSON object)::

    {"topic": "T", "message": "<body>", "countdown": 120}

``countdown`` is seconds (integer or decimal, >= 0), counted from the request
record's timestamp — when the producer sent it, so a consumer backlog does not
push the timer later, and a re-read computes the same due time. Instead of
``countdown`` a request may give ``"at"``: the due time in epoch **seconds**
(integer or decimal). Optional ``"key"``: the key of the delivered record
(default: the request record's key).

When it fires, ``message`` (UTF-8) goes to ``topic`` with that key and the
request's ``CALLER_SERVICE`` header, if it had one. The format has no id, so it
has no update or cancel: every record is a new timer, with the stable derived id
``seed-<topic>-<partition>-<offset>``.

Any value gives a timer or a rejection: numbers out of range (``1e400``,
``Infinity``, integers of up to 4,300 digits) are ``bad-due-time``, strings
that are no Unicode text (JSON ``"\\ud800"``) ``invalid-field``, what does not
parse (nested too deeply, or integers longer than Python reads) ``undecodable``.
"""

from __future__ import annotations

import json
import math

from futures.ingress.base import MAX_DUE_MS, ParseContext, Rejection, Request, short
from futures.ingress.records import SourceRecord
from ktimers.wire import Future, Header, header_value

H_CALLER = "CALLER_SERVICE"

F_TOPIC = "topic"
F_MESSAGE = "message"
F_COUNTDOWN = "countdown"
F_AT = "at"
F_KEY = "key"

#: Seconds past which no due time is valid, from any record timestamp: year 9999.
_MAX_SECONDS = MAX_DUE_MS // 1000 + 1


def parse(record: SourceRecord, context: ParseContext) -> list[Request]:
    return [_parse(record, context)]


def _seconds(value: object) -> float | None:
    """A JSON number of seconds, or None (booleans are JSON numbers to Python, not to us).

    Python's JSON reads ``NaN``, ``Infinity`` and integers of up to 4,300
    digits; an integer too large for a float comes back as an infinity (it is
    out of range all the same), NaN as is.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > _MAX_SECONDS:
        return math.inf if value > 0 else -math.inf  # float(value) would overflow
    return float(value)


def _number(value: object) -> str:
    """A JSON number for a detail: a number of 4,000 digits is cut."""
    return short(str(value), 40)


def _parse(record: SourceRecord, context: ParseContext) -> Request:
    tid = context.derived_id(record)
    if record.value is None:
        return Rejection(record, "undecodable", "tombstone (null value): expected a JSON object", tid)
    try:
        body = json.loads(record.value)
    except ValueError as exc:  # UnicodeDecodeError too; and integers of more than 4,300 digits
        return Rejection(record, "undecodable", short(f"not JSON: {exc}"), tid)
    except RecursionError:
        return Rejection(record, "undecodable", "not JSON: nested too deeply", tid)
    if not isinstance(body, dict):
        return Rejection(record, "undecodable", f"expected a JSON object, got {type(body).__name__}", tid)
    for name in (F_TOPIC, F_MESSAGE):
        if name not in body:
            return Rejection(record, "missing-field", f'no "{name}" field', tid)
    topic, message = body[F_TOPIC], body[F_MESSAGE]
    if not isinstance(topic, str):
        return Rejection(record, "invalid-field", f'"{F_TOPIC}" must be a string', tid)
    if not isinstance(message, str):
        return Rejection(
            record, "invalid-field", f'"{F_MESSAGE}" must be a string (the body to deliver)', tid
        )
    key = body.get(F_KEY)
    if key is None:
        try:
            key = (record.key or b"").decode()
        except UnicodeDecodeError:
            return Rejection(
                record, "invalid-field", f'no "{F_KEY}" field and the record key is not UTF-8', tid
            )
    elif not isinstance(key, str):
        return Rejection(record, "invalid-field", f'"{F_KEY}" must be a string', tid)
    due_ms = _due_ms(record, body, context)
    if isinstance(due_ms, Rejection):
        return due_ms
    caller = header_value(record.headers, H_CALLER)
    try:
        future = Future(
            callBackTopic=topic,
            callBackKey=key,
            callBack=message.encode(),
            id=tid,
            headers=[Header(key=H_CALLER, value=caller)] if caller is not None else [],
        )
    except ValueError:  # UnicodeEncodeError: JSON's "\ud800" escapes decode to lone surrogates
        fields = ((F_TOPIC, topic), (F_MESSAGE, message), (F_KEY, key))
        bad = next((n for n, v in fields if not _is_text(v)), None)
        if bad is None:
            raise
        return Rejection(record, "invalid-field", f'"{bad}" is not Unicode text (a lone surrogate)', tid)
    return context.accept(record, future, due_ms)


def _is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _due_ms(record: SourceRecord, body: dict[str, object], context: ParseContext) -> int | Rejection:
    tid = context.derived_id(record)
    has_countdown, has_at = F_COUNTDOWN in body, F_AT in body
    if has_countdown == has_at:
        detail = f'give exactly one of "{F_COUNTDOWN}" (seconds from now) and "{F_AT}" (epoch seconds)'
        return Rejection(record, "missing-field" if not has_at else "bad-due-time", detail, tid)
    name = F_COUNTDOWN if has_countdown else F_AT
    seconds = _seconds(body[name])
    if seconds is None or math.isnan(seconds):
        return Rejection(record, "bad-due-time", f'"{name}" must be a finite number of seconds', tid)
    if seconds < 0:
        return Rejection(record, "bad-due-time", f'"{name}"={_number(body[name])} is negative', tid)
    if seconds > _MAX_SECONDS:
        detail = f'"{name}"={_number(body[name])} seconds is beyond the year 9999'
        return Rejection(record, "bad-due-time", detail, tid)
    if has_at:
        return round(seconds * 1000)
    sent_ms = record.timestamp_ms if record.timestamp_ms >= 0 else context.now_ms
    return sent_ms + round(seconds * 1000)
