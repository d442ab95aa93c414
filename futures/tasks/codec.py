"""A task call on the wire: a small JSON object, never pickle.

``{"v": 1, "task": "send-reminder", "args": [...], "kwargs": {...}, "attempt": 0}``

JSON keeps a call readable in any Kafka tool and means a record can only ever
name a registered function and hand it plain data: nothing in it is executed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from futures.tasks.errors import TaskError

VERSION = 1


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
            return json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise TaskError(
                f"the arguments of task {self.task!r} must be JSON data "
                f"(str, int, float, bool, None, lists and str-keyed dicts of them): {exc}"
            ) from exc

    def retry(self) -> TaskCall:
        return TaskCall(self.task, self.args, self.kwargs, self.attempt + 1)


def decode(value: bytes | None) -> TaskCall:
    """The call in a task record; raises :class:`UndecodableCall` saying what is wrong."""
    if value is None:
        raise UndecodableCall("null value: expected a JSON task call")
    try:
        body = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UndecodableCall(f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise UndecodableCall("expected a JSON object")
    if body.get("v") != VERSION:
        raise UndecodableCall(f"unknown task call version {body.get('v')!r} (this worker reads {VERSION})")
    task, args, kwargs, attempt = (
        body.get("task"),
        body.get("args", []),
        body.get("kwargs", {}),
        body.get("attempt", 0),
    )
    if not isinstance(task, str) or not task:
        raise UndecodableCall('"task" must be a non-empty string')
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UndecodableCall('"args" must be a list and "kwargs" an object')
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise UndecodableCall('"attempt" must be an integer >= 0')
    return TaskCall(task, tuple(args), kwargs, attempt)
