"""The task worker's decisions for one callback: run, retry with backoff, or dead-letter."""

from __future__ import annotations

import asyncio

import pytest

from futures.client.guard import MemoryTokenGuard
from futures.ingress.records import SourceRecord
from futures.tasks import RetryPolicy, TaskConfig, TaskRegistry
from futures.tasks.codec import TaskCall
from futures.tasks.runner import DeadLetter, Outcome, TaskRunner

CONFIG = TaskConfig(retry=RetryPolicy(max_retries=2, backoff_s=1.0, multiplier=2.0))


class Harness:
    def __init__(self, guard=None) -> None:
        self.tasks = TaskRegistry(CONFIG)
        self.calls: list[tuple] = []
        self.retries: list[tuple[TaskCall, float, str]] = []
        self.dead: list[DeadLetter] = []
        self.runner = TaskRunner(self.tasks, lambda *a: self.retries.append(a), self.dead.append, guard=guard)
        self._offset = 0

    def callback(
        self, value: bytes | None, timer_id: str = "t-1", token: bytes | None = None
    ) -> SourceRecord:
        headers = [("kt-id", timer_id.encode()), ("kt-due-ms", b"1")]
        if token is not None:
            headers.append(("kt-token", token))
        self._offset += 1
        return SourceRecord("timer-tasks", 0, self._offset, b"key", value, tuple(headers))

    def handle(self, call: TaskCall, **kw) -> Outcome:
        return self.runner.handle(self.callback(call.encode(), **kw))


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_a_registered_task_runs_with_its_arguments(h):
    h.tasks.register("greet")(lambda name, punct="!": h.calls.append((name, punct)))
    assert h.handle(TaskCall("greet", ("ada",), {"punct": "?"})) is Outcome.RAN
    assert h.calls == [("ada", "?")]


def test_an_async_task_is_awaited(h):
    async def work(n: int) -> None:
        await asyncio.sleep(0)
        h.calls.append(n)

    h.tasks.register("async-work")(work)
    assert h.handle(TaskCall("async-work", (3,))) is Outcome.RAN
    assert h.calls == [3]


def test_a_repeated_callback_runs_once(h):
    h.tasks.register("once")(lambda: h.calls.append(1))
    record = h.callback(TaskCall("once").encode(), timer_id="t-9")
    assert [h.runner.handle(record), h.runner.handle(record)] == [Outcome.RAN, Outcome.REPEAT]
    assert h.calls == [1]


def test_an_unregistered_name_is_refused_and_dead_lettered(h):
    h.tasks.register("known")(lambda: None)
    assert h.handle(TaskCall("rm-rf", ("/",))) is Outcome.DEAD
    [letter] = h.dead
    assert (letter.reason, letter.task) == ("unknown-task", "rm-rf")
    assert "registered: known" in letter.error


def test_an_undecodable_call_is_dead_lettered(h):
    assert h.runner.handle(h.callback(b"\x80\x04pickle?")) is Outcome.DEAD
    assert h.dead[0].reason == "undecodable"


def test_a_failing_task_is_retried_with_backoff_then_dead_lettered_with_the_error(h):
    def flaky(n: int) -> None:
        h.calls.append(n)
        raise ValueError(f"bad {n}")

    h.tasks.register("flaky")(flaky)
    call = TaskCall("flaky", (7,))
    assert h.handle(call, timer_id="job-1") is Outcome.RETRY
    retry, delay, retry_id = h.retries[-1]
    assert (retry.attempt, retry.args, delay, retry_id) == (1, (7,), 1.0, "job-1.retry-1")
    assert h.handle(retry, timer_id=retry_id) is Outcome.RETRY
    assert (h.retries[-1][0].attempt, h.retries[-1][1]) == (2, 2.0)
    assert h.handle(h.retries[-1][0], timer_id=h.retries[-1][2]) is Outcome.DEAD
    [letter] = h.dead
    assert (letter.reason, letter.task, letter.attempts) == ("task-failed", "flaky", 3)
    assert letter.error == "ValueError: bad 7"
    assert h.calls == [7, 7, 7]


def test_a_task_without_retries_is_dead_lettered_on_its_first_failure(h):
    h.tasks.register("fragile", max_retries=0)(lambda: 1 / 0)
    assert h.handle(TaskCall("fragile")) is Outcome.DEAD
    assert h.retries == [] and "ZeroDivisionError" in h.dead[0].error


def test_a_superseded_token_is_not_run():
    guard = MemoryTokenGuard()
    h = Harness(guard=guard)
    h.tasks.register("remind")(lambda: h.calls.append("ran"))
    old = guard.arm("reminder-1")
    new = guard.arm("reminder-1")  # re-armed: the first call is cancelled
    assert h.handle(TaskCall("remind"), timer_id="reminder-1", token=old.encode()) is Outcome.SUPERSEDED
    assert h.handle(TaskCall("remind"), timer_id="reminder-1", token=new.encode()) is Outcome.RAN
    assert h.calls == ["ran"]
