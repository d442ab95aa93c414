"""Delayed tasks end to end: a timer service, a task worker process, and calls scheduled by name."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from futures.tasks import TaskConfig, TaskRegistry
from ktimers.wire import header_value
from tests.integration.conftest import Callback, Stack
from tests.processes import SpawnFn
from tests.tasks import sample

pytestmark = pytest.mark.integration


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_delayed_task_runs_once_at_its_time_and_bad_calls_are_dead_lettered(
    running: Stack, spawn: SpawnFn, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    # The timer worker of this stack only allows callback topics named cb-*.
    config = TaskConfig(topic=f"cb-tasks-{suffix}", dlq=f"tasks-dlq-{suffix}", group=f"tasks-{suffix}")
    log = tmp_path / "tasks.jsonl"
    env = {
        **running.env,
        "TIMERS_TASKS_TOPIC": config.topic,
        "TIMERS_TASKS_DLQ": config.dlq,
        "TIMERS_TASKS_GROUP": config.group,
        "TASKS_LOG": str(log),
    }
    worker = spawn("task-worker", ["-m", "futures.tasks.worker", "tests.tasks.sample"], env)
    worker.wait_for_output("task worker ready", timeout_s=30)

    # The scheduling side: the same names, whatever module registers them there.
    tasks = TaskRegistry(config, common=running.common)
    reminder = tasks.register("send-reminder")(sample.send_reminder.fn)
    failing = tasks.register("always-fails", max_retries=1)(sample.always_fails.fn)
    stranger = tasks.register("not-in-the-worker")(lambda: None)
    due = reminder.apply_later("u-4", "stand-up", urgent=True, delay=3).due_ms
    failing.apply_later(5, delay=1)
    stranger.apply_later(delay=1)
    tasks.close()

    dlq = running.reader(config.dlq)
    dlq.read_until(lambda r: len(r) >= 2, timeout_s=40)
    deadline = time.monotonic() + 20
    while not any(e["task"] == "send-reminder" for e in read_log(log)) and time.monotonic() < deadline:
        time.sleep(0.2)
    dlq.poll(1.5)

    entries = read_log(log)
    reminders = [e for e in entries if e["task"] == "send-reminder"]
    assert [(e["args"], e["urgent"]) for e in reminders] == [(["u-4", "stand-up"], True)]
    assert reminders[0]["at_ms"] >= due, "ran early"
    # The first run, then one retry (max_retries=1), then the dead-letter topic.
    assert [e["n"] for e in entries if e["task"] == "always-fails"] == [5, 5]

    by_reason = {header(r, "kt-reason"): r for r in dlq.records}
    assert set(by_reason) == {"unknown-task", "task-failed"}
    assert header(by_reason["unknown-task"], "kt-task") == "not-in-the-worker"
    failed = by_reason["task-failed"]
    assert (header(failed, "kt-task"), header(failed, "kt-attempts")) == ("always-fails", "2")
    assert header(failed, "kt-error") == "RuntimeError: boom 5"
    assert json.loads(failed.value or b"")["args"] == [5]  # the call, as it was: fix and resend


def header(record: Callback, name: str) -> str:
    return (header_value(record.headers, name) or b"").decode()
