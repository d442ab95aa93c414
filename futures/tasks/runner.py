"""What the task worker does with one callback on the task topic: run it, retry it, or dead-letter it.

Free of Kafka: the worker hands in records and gets back what to do; retries go
out through a ``schedule_retry`` function (a timer), dead letters through
``dead_letter``. Both must be durable before the record's offset is committed.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from futures.guard import TokenGuard
from futures.records import SourceRecord
from futures.tasks.codec import TaskCall, UndecodableCall, decode
from futures.tasks.registry import TaskRegistry
from ktimers.wire import H_ID, H_TOKEN, header_value

log = logging.getLogger(__name__)

#: Callback ids remembered to drop a repeated callback (the timer service
#: delivers at least once): enough for minutes of calls, bounded memory.
RECENT_IDS = 100_000


class Outcome(enum.Enum):
    RAN = "ran"
    RETRY = "retry"  # failed; a retry is scheduled
    DEAD = "dead"  # dead-lettered: unknown task, undecodable, or failed for good
    REPEAT = "repeat"  # a repeated callback of a call already run here
    SUPERSEDED = "superseded"  # its token is no longer armed (cancelled through the guard)


@dataclass(frozen=True)
class DeadLetter:
    record: SourceRecord
    reason: str  # "undecodable", "unknown-task", "task-failed"
    error: str
    task: str = ""
    attempts: int = 0


ScheduleRetry = Callable[[TaskCall, float, str], None]  # (call, delay s, timer id)
DeadLetterFn = Callable[[DeadLetter], None]


class TaskRunner:
    def __init__(
        self,
        registry: TaskRegistry,
        schedule_retry: ScheduleRetry,
        dead_letter: DeadLetterFn,
        *,
        guard: TokenGuard | None = None,
    ) -> None:
        self._registry = registry
        self._schedule_retry = schedule_retry
        self._dead_letter = dead_letter
        self._guard = guard
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle(self, record: SourceRecord) -> Outcome:
        timer_id = (header_value(record.headers, H_ID) or b"").decode(errors="replace")
        if timer_id and timer_id in self._recent:
            return Outcome.REPEAT
        try:
            call = decode(record.value)
        except UndecodableCall as exc:
            return self._dead(DeadLetter(record, "undecodable", str(exc)))
        if call.task not in self._registry:
            known = ", ".join(self._registry) or "none"
            error = f"no task {call.task!r} is registered in this worker (registered: {known})"
            return self._dead(DeadLetter(record, "unknown-task", error, call.task, call.attempt))
        if self._guard is not None and header_value(record.headers, H_TOKEN):
            # Armed under the first attempt's timer id; retries carry no token.
            if not self._guard.accept(timer_id, record.headers):
                return Outcome.SUPERSEDED
        task = self._registry.get(call.task)
        try:
            self._run(task.fn, call)
        except Exception as exc:  # noqa: BLE001 - any failure of user code is retried or dead-lettered
            error = "".join(traceback.format_exception_only(exc)).strip()
            if call.attempt < task.retry.max_retries:
                delay = task.retry.delay_s(call.attempt)
                log.warning(
                    "task %s attempt %d failed (%s); retry in %.1fs", call.task, call.attempt, error, delay
                )
                self._schedule_retry(call.retry(), delay, f"{timer_id or call.task}.retry-{call.attempt + 1}")
                self._remember(timer_id)
                return Outcome.RETRY
            log.error("task %s failed after %d attempt(s): %s", call.task, call.attempt + 1, error)
            return self._dead(DeadLetter(record, "task-failed", error, call.task, call.attempt + 1), timer_id)
        self._remember(timer_id)
        return Outcome.RAN

    def _run(self, fn: Callable[..., object], call: TaskCall) -> None:
        result = fn(*call.args, **(call.kwargs or {}))
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(result)

    def _dead(self, letter: DeadLetter, timer_id: str = "") -> Outcome:
        self._dead_letter(letter)
        self._remember(timer_id)
        return Outcome.DEAD

    def _remember(self, timer_id: str) -> None:
        if not timer_id:
            return
        self._recent[timer_id] = None
        if len(self._recent) > RECENT_IDS:
            self._recent.popitem(last=False)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
