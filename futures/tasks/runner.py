"""What the task worker does with one callback on the task topic: run it, retry it, or dead-letter it.

Free of Kafka: the worker hands in records and gets back what to do; retries go
out through a ``schedule_retry`` function (a timer), dead letters through
``dead_letter``. Both must be durable before the record's offset is committed.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import inspect
import logging
import traceback
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from futures.client.guard import TokenGuard
from futures.ingress.records import SourceRecord
from futures.tasks.codec import TaskCall, UndecodableCall, decode
from futures.tasks.errors import UnschedulableRetry
from futures.tasks.registry import TaskRegistry
from ktimers.deadletter import short
from ktimers.logs import ThrottledLog
from ktimers.wire import H_ID, H_TOKEN, MAX_ID_BYTES, header_value

log = logging.getLogger(__name__)

#: Callback ids remembered to drop a repeated callback (the timer service
#: delivers at least once): enough for minutes of calls, bounded memory.
RECENT_IDS = 100_000
# A callback id longer than the service's MAX_ID_BYTES is remembered, and its retries named, by a digest.


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
    error: str  # bounded (ktimers.deadletter.short): never grows with the record
    task: str = ""
    attempts: int = 0


ScheduleRetry = Callable[[TaskCall, float, str], None]  # (call, delay s, timer id)
DeadLetterFn = Callable[[DeadLetter], None]


class TaskRunner:
    """Runs, retries or dead-letters one callback at a time; no record makes it raise.

    Only the ``schedule_retry`` and ``dead_letter`` functions may raise (Kafka
    is down): the worker then stops before committing, and reads the record again.
    """

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
        #: Dead-lettered records by reason, since this runner started.
        self.dead_counts: Counter[str] = Counter()
        self._dead_log = ThrottledLog(log)
        self._retry_log = ThrottledLog(log)

    def handle(self, record: SourceRecord) -> Outcome:
        timer_id = (header_value(record.headers, H_ID) or b"").decode(errors="replace")
        if timer_id and _id_key(timer_id) in self._recent:
            return Outcome.REPEAT
        try:
            call = decode(record.value)
        except UndecodableCall as exc:
            return self.reject(record, "undecodable", str(exc))
        if call.task not in self._registry:
            known = ", ".join(self._registry) or "none"
            error = f"no task {call.task!r} is registered in this worker (registered: {known})"
            return self._dead(DeadLetter(record, "unknown-task", short(error), call.task, call.attempt))
        if self._guard is not None and header_value(record.headers, H_TOKEN):
            # Armed under the first attempt's timer id; retries carry no token.
            if not self._guard.accept(timer_id, record.headers):
                return Outcome.SUPERSEDED
        task = self._registry.get(call.task)
        try:
            self._run(task.fn, call)
        except Exception as exc:  # noqa: BLE001 - any failure of user code is retried or dead-lettered
            error = short("".join(traceback.format_exception_only(exc)).strip())
            if call.attempt < task.retry.max_retries:
                delay = task.retry.delay_s(call.attempt)
                next_id = retry_id(timer_id or call.task, call.attempt + 1)
                try:
                    self._schedule_retry(call.retry(), delay, next_id)
                except UnschedulableRetry as why:
                    error = short(f"{error}; no retry: {why}")
                else:
                    self._retry_log.warning(
                        "task %s attempt %d failed (%s); retry in %.1fs",
                        call.task, call.attempt, error, delay,
                    )  # fmt: skip
                    self._remember(timer_id)
                    return Outcome.RETRY
            letter = DeadLetter(record, "task-failed", error, call.task, call.attempt + 1)
            return self._dead(letter, timer_id)
        self._remember(timer_id)
        return Outcome.RAN

    def reject(self, record: SourceRecord, reason: str, error: str) -> Outcome:
        """Dead-letter a record that is not a call this worker can run (``reason`` e.g. "undecodable")."""
        return self._dead(DeadLetter(record, reason, short(error)))

    def _run(self, fn: Callable[..., object], call: TaskCall) -> None:
        result = fn(*call.args, **(call.kwargs or {}))
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(result)

    def _dead(self, letter: DeadLetter, timer_id: str = "") -> Outcome:
        self._dead_letter(letter)
        self._remember(timer_id)
        self.dead_counts[letter.reason] += 1
        level = logging.ERROR if letter.reason == "task-failed" else logging.WARNING
        self._dead_log.log(
            level,
            "dead-lettered %s (%s, %d so far): %s",
            letter.record.where(), letter.reason, self.dead_counts[letter.reason], letter.error,
        )  # fmt: skip
        return Outcome.DEAD

    def _remember(self, timer_id: str) -> None:
        if not timer_id:
            return
        self._recent[_id_key(timer_id)] = None
        if len(self._recent) > RECENT_IDS:
            self._recent.popitem(last=False)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


def _id_key(timer_id: str) -> str:
    """What is remembered of a timer id: the id, or a digest of one longer than any timer's."""
    if len(timer_id) * 4 <= MAX_ID_BYTES or len(timer_id.encode()) <= MAX_ID_BYTES:
        return timer_id
    return "#" + hashlib.blake2b(timer_id.encode(), digest_size=16).hexdigest()


def retry_id(timer_id: str, attempt: int) -> str:
    """The timer id of retry ``attempt`` (1-based) of the call from timer ``timer_id``.

    Derived, not random, so a repeated callback schedules the same retry (it
    replaces the pending one). Within the timer service's id limit, whatever the id.
    """
    suffix = f".retry-{attempt}"
    if len((timer_id + suffix).encode()) > MAX_ID_BYTES:
        timer_id = "#" + hashlib.blake2b(timer_id.encode(), digest_size=16).hexdigest()
    return timer_id + suffix
