"""Task layer configuration: topics, consumer group and the retry policy, from ``TIMERS_TASKS_*``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ktimers.config import Env, EnvVar, env_float, env_int
from ktimers.errors import ConfigError

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")

#: What :meth:`TaskConfig.from_env` reads (docs/configuration.md).
TASKS_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "TIMERS_TASKS_TOPIC", "timer-tasks", "callback topic of task timers, which the task worker consumes"
    ),
    EnvVar("TIMERS_TASKS_DLQ", "timer-tasks-dlq", "calls that cannot run, as they were, with kt-reason"),
    EnvVar("TIMERS_TASKS_GROUP", "timer-tasks", "consumer group of the task workers"),
    EnvVar("TIMERS_TASKS_MAX_RETRIES", "3", "retries of a failing task"),
    EnvVar("TIMERS_TASKS_BACKOFF_S", "1", "delay before the first retry, seconds"),
    EnvVar("TIMERS_TASKS_BACKOFF_MULTIPLIER", "2", "each retry waits this many times longer than the last"),
    EnvVar("TIMERS_TASKS_BACKOFF_MAX_S", "300", "longest delay between two attempts, seconds"),
)


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing task is retried: ``max_retries`` more attempts, each after a growing delay.

    Attempt n (0 = the first run) that fails is retried after
    ``min(backoff_s * multiplier**n, max_backoff_s)`` seconds, through a timer,
    so a pending retry survives a restart of the task worker.
    """

    max_retries: int = 3
    backoff_s: float = 1.0
    multiplier: float = 2.0
    max_backoff_s: float = 300.0

    def validate(self) -> None:
        if self.max_retries < 0:
            raise ConfigError("TIMERS_TASKS_MAX_RETRIES must be >= 0")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("TIMERS_TASKS_BACKOFF_S and TIMERS_TASKS_BACKOFF_MAX_S must be >= 0")
        if self.multiplier < 1:
            raise ConfigError("TIMERS_TASKS_BACKOFF_MULTIPLIER must be >= 1")

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait before retrying a failed attempt ``attempt`` (0-based)."""
        return float(min(self.backoff_s * self.multiplier**attempt, self.max_backoff_s))


@dataclass(frozen=True)
class TaskConfig:
    """Where task calls travel and how failures are handled (docs/request-topics.md)."""

    #: Callback topic of task timers: the task worker consumes it. The timer
    #: worker must allow it as a callback topic (TIMERS_ALLOWED_CALLBACK_TOPICS).
    topic: str = "timer-tasks"
    #: Calls that cannot run: unknown task, undecodable, or failed after every retry.
    dlq: str = "timer-tasks-dlq"
    group: str = "timer-tasks"
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def from_env(cls, env: Env | None = None) -> TaskConfig:
        env = os.environ if env is None else env
        default = RetryPolicy()
        config = cls(
            topic=env.get("TIMERS_TASKS_TOPIC") or cls.topic,
            dlq=env.get("TIMERS_TASKS_DLQ") or cls.dlq,
            group=env.get("TIMERS_TASKS_GROUP") or cls.group,
            retry=RetryPolicy(
                max_retries=env_int(env, "TIMERS_TASKS_MAX_RETRIES", default.max_retries),
                backoff_s=env_float(env, "TIMERS_TASKS_BACKOFF_S", default.backoff_s),
                multiplier=env_float(env, "TIMERS_TASKS_BACKOFF_MULTIPLIER", default.multiplier),
                max_backoff_s=env_float(env, "TIMERS_TASKS_BACKOFF_MAX_S", default.max_backoff_s),
            ),
        )
        config.validate()
        return config

    def validate(self) -> None:
        for name, topic in (("TIMERS_TASKS_TOPIC", self.topic), ("TIMERS_TASKS_DLQ", self.dlq)):
            if not _TOPIC.fullmatch(topic):
                raise ConfigError(f"{name}={topic!r} is not a valid Kafka topic name")
        if self.topic == self.dlq:
            raise ConfigError("TIMERS_TASKS_TOPIC and TIMERS_TASKS_DLQ must differ")
        self.retry.validate()
