"""A task call on the wire: a small JSON object, never pickle.

``{"v": 1, "task": "send-reminder", "args": [...], "kwargs": {...}, "attempt": 0}``

JSON keeps a call readable in any Kafka tool and means a record can only ever
name a registered function and hand it plain data: nothing in it is executed.

Anyone who can write to the task topic can put any bytes there, so
:func:`decode` accepts exactly what :meth:`TaskCall.encode` can write — UTF-8
JSON, finite numbers, no lone surrogates, bounded nesting — and refuses
everything else with :class:`UndecodableCall`, whose message never grows with
the input. A call it accepts can always be encoded again for its retry.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass
from typing import Any

from futures.tasks.errors import TaskError
from ktimers.deadletter import short

VERSION = 1

#: A task name: what ``TaskRegistry.register`` accepts, and all a call may name.
TASK_NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")
#: Deepest nesting of lists and objects in a call's arguments.
MAX_DEPTH = 64
#: Highest ``attempt`` a call may carry (a sanity bound: retries are counted from 0).
MAX_ATTEMPT = 2**31 - 1

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _repr.maxlong = 40
_repr.maxlist = _repr.maxdict = 4
_repr.maxlevel = 2
#: A value for an error message: a short repr, whatever the value's size.
_preview = _repr.repr


class UndecodableCall(TaskError):
    """A record on the task topic is not a task call."""


@dataclass(frozen=True)
class TaskCall:
    task: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    attempt: int = 0  # 0 = first run; n = n-th retry

    def encode(self) -> bytes:
        body = {"v": VERSION, "task": self.task, "args": list(self.args), "kwargs": self.kwargs or {}}
        body["attempt"] = self.attempt
        try:
            if _depth(body["args"]) > MAX_DEPTH or _depth(body["kwargs"]) > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            return json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise TaskError(
                f"the arguments of task {_preview(self.task)} must be JSON data "
                f"(str, int, float, bool, None, lists and str-keyed dicts of them): {short(str(exc))}"
            ) from exc

    def retry(self) -> TaskCall:
        return TaskCall(self.task, self.args, self.kwargs, self.attempt + 1)


def decode(value: bytes | None) -> TaskCall:
    """The call in a task record; raises :class:`UndecodableCall` saying what is wrong, and nothing else."""
    try:
        return _decode(value)
    except UndecodableCall:
        raise
    except RecursionError as exc:
        raise UndecodableCall(f"nested deeper than this worker reads (at most {MAX_DEPTH} levels)") from exc
    except Exception as exc:  # any input must end in a rejection, never in a crash of the worker
        raise UndecodableCall(f"cannot decode: {type(exc).__name__}: {short(str(exc))}") from exc


def _decode(value: bytes | None) -> TaskCall:
    if value is None:
        raise UndecodableCall("null value: expected a JSON task call")
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UndecodableCall(f"not JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        body = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # not JSON, NaN/Infinity, or an integer of more than 4300 digits
        raise UndecodableCall(f"not JSON: {short(str(exc))}") from exc
    if not isinstance(body, dict):
        raise UndecodableCall("expected a JSON object")
    if body.get("v") != VERSION:
        raise UndecodableCall(
            f"unknown task call version {_preview(body.get('v'))} (this worker reads {VERSION})"
        )
    task, args, kwargs, attempt = (
        body.get("task"),
        body.get("args", []),
        body.get("kwargs", {}),
        body.get("attempt", 0),
    )
    if not isinstance(task, str) or not TASK_NAME.fullmatch(task):
        raise UndecodableCall('"task" must be a task name: 1-200 letters, digits, ".", "_", ":" or "-"')
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UndecodableCall('"args" must be a list and "kwargs" an object')
    if _depth(args) > MAX_DEPTH or _depth(kwargs) > MAX_DEPTH:
        raise UndecodableCall(f'"args" and "kwargs" must not nest deeper than {MAX_DEPTH} levels')
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= MAX_ATTEMPT:
        raise UndecodableCall(f'"attempt" must be an integer from 0 to {MAX_ATTEMPT}')
    call = TaskCall(task, tuple(args), kwargs, attempt)
    try:
        call.encode()  # its retry must be writable: no lone surrogates, no infinite floats (1e999)
    except TaskError as exc:
        raise UndecodableCall(f"not a call this worker can write again: {exc}") from exc
    return call


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: object) -> int:
    """How deeply lists and dicts nest in ``value`` (0 for a scalar); stops counting past MAX_DEPTH."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | tuple | dict):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
