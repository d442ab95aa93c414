"""Registering tasks and scheduling their calls (a fake producer stands in for Kafka)."""

from __future__ import annotations

import json

import pytest

from futures.client import TimerClient
from futures.tasks import RetryPolicy, TaskConfig, TaskError, TaskRegistry, UnknownTask
from futures.tasks.codec import TaskCall, UndecodableCall, decode
from ktimers.config import CommonConfig
from ktimers.errors import ConfigError
from ktimers.wire import Future
from tests.client.test_client_bulk import FakeProducer

NOW = 1_800_000_000.0
CONFIG = TaskConfig(topic="app-tasks", dlq="app-tasks-dlq", retry=RetryPolicy(max_retries=2, backoff_s=1.5))


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


@pytest.fixture
def tasks(producer: FakeProducer) -> TaskRegistry:
    client = TimerClient(CommonConfig(), producer=producer, clock=lambda: NOW)
    return TaskRegistry(CONFIG, client=client)


def test_apply_later_schedules_a_json_call_on_the_task_topic(tasks, producer):
    @tasks.register("send-reminder")
    def send_reminder(user_id: str, text: str, urgent: bool = False) -> str:
        return f"{user_id}:{text}"

    handle = send_reminder.apply_later("u-4", "stand-up", urgent=True, delay=90, id="reminder-u4")
    [sent] = producer.sent
    future = Future.FromString(sent.value)
    assert (future.callBackTopic, future.callBackKey, future.id) == (
        "app-tasks",
        "send-reminder",
        "reminder-u4",
    )
    assert json.loads(future.callBack) == {
        "v": 1,
        "task": "send-reminder",
        "args": ["u-4", "stand-up"],
        "kwargs": {"urgent": True},
        "attempt": 0,
    }
    assert handle.due_ms == (NOW + 90) * 1000
    assert send_reminder("u-1", "now") == "u-1:now"  # still callable here and now


def test_arguments_are_checked_when_scheduling_not_when_running(tasks, producer):
    @tasks.register("add")
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(TaskError, match="missing a required argument"):
        add.apply_later(1, delay=5)
    with pytest.raises(TaskError, match="JSON data"):
        add.apply_later(1, {2, 3}, delay=5)  # a set is not JSON
    with pytest.raises(TaskError, match="JSON data"):
        add.apply_later(1, float("nan"), delay=5)
    assert producer.sent == []


def test_only_registered_names_can_be_called_by_name(tasks):
    @tasks.register("known")
    def known() -> None: ...

    with pytest.raises(UnknownTask, match="'unknown'.*registered: known"):
        tasks.apply_later("unknown", delay=1)
    assert "known" in tasks and list(tasks) == ["known"]


@pytest.mark.parametrize("name", ["", "has space", "x" * 201, "semi;colon"])
def test_task_names_are_checked(tasks, name):
    with pytest.raises(TaskError, match="task name"):
        tasks.register(name)


def test_a_name_is_registered_once(tasks):
    tasks.register("dup")(lambda: None)
    with pytest.raises(TaskError, match="already registered"):
        tasks.register("dup")(lambda: None)


def test_per_task_retry_policy_overrides_the_registry_default(tasks):
    default = tasks.register("default")(lambda: None)
    custom = tasks.register("custom", max_retries=0, backoff_s=10)(lambda: None)
    assert default.retry == CONFIG.retry
    assert (custom.retry.max_retries, custom.retry.backoff_s, custom.retry.multiplier) == (0, 10, 2.0)


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(max_retries=5, backoff_s=1.0, multiplier=3.0, max_backoff_s=20.0)
    assert [policy.delay_s(n) for n in range(5)] == [1.0, 3.0, 9.0, 20.0, 20.0]


def test_config_from_env_and_its_errors():
    config = TaskConfig.from_env(
        {"TIMERS_TASKS_TOPIC": "t", "TIMERS_TASKS_MAX_RETRIES": "7", "TIMERS_TASKS_BACKOFF_S": "0.5"}
    )
    assert (config.topic, config.dlq, config.retry.max_retries, config.retry.backoff_s) == (
        "t",
        "timer-tasks-dlq",
        7,
        0.5,
    )
    with pytest.raises(ConfigError, match="TIMERS_TASKS_MAX_RETRIES"):
        TaskConfig.from_env({"TIMERS_TASKS_MAX_RETRIES": "-1"})
    with pytest.raises(ConfigError, match="must differ"):
        TaskConfig.from_env({"TIMERS_TASKS_TOPIC": "x", "TIMERS_TASKS_DLQ": "x"})
    with pytest.raises(ConfigError, match="TIMERS_TASKS_BACKOFF_MULTIPLIER"):
        TaskConfig.from_env({"TIMERS_TASKS_BACKOFF_MULTIPLIER": "0.5"})


def test_call_round_trip_and_undecodable_calls():
    call = TaskCall("t", ("a", 1), {"k": [1, 2]}, attempt=2)
    assert decode(call.encode()) == call
    for bad, message in [
        (None, "null"),
        (b"\x80abc", "not JSON"),
        (b"[]", "object"),
        (b'{"v": 2, "task": "t"}', "version"),
        (b'{"v": 1, "task": ""}', "task"),
        (b'{"v": 1, "task": "t", "args": {}}', "args"),
        (b'{"v": 1, "task": "t", "attempt": -1}', "attempt"),
    ]:
        with pytest.raises(UndecodableCall, match=message):
            decode(bad)
