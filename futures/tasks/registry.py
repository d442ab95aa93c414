"""Register functions by name and call them later through durable timers.

::

    tasks = TaskRegistry()

    @tasks.register("send-reminder")
    def send_reminder(user_id: str, text: str) -> None: ...

    handle = send_reminder.apply_later("u-4", "stand-up", delay=3600)
    tasks.client.cancel(handle)          # the same cancel as any timer

A call is a timer whose callback is a JSON :class:`~futures.tasks.codec.TaskCall`
on the task topic; the task worker (``timers-tasks``) runs it when it arrives.
Only names registered in the worker's registry run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from futures.client import AsyncTimerClient, TimerClient, TimerHandle
from futures.tasks.codec import TASK_NAME, TaskCall
from futures.tasks.config import RetryPolicy, TaskConfig
from futures.tasks.errors import TaskError, UnknownTask
from ktimers.config import CommonConfig

R = TypeVar("R")


@dataclass(frozen=True, eq=False)
class Task(Generic[R]):
    """A registered function. Calling it runs it here and now; ``apply_later`` runs it in the task worker."""

    name: str
    fn: Callable[..., R]
    retry: RetryPolicy
    registry: TaskRegistry

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TaskCall:
        """The wire form of a call; refuses arguments the function would not take, or that are not JSON."""
        try:
            inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise TaskError(f"task {self.name!r}: {exc}") from exc
        call = TaskCall(self.name, tuple(args), dict(kwargs))
        call.encode()  # raises TaskError now, not in the worker, when not JSON
        return call

    def apply_later(
        self,
        *args: Any,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
        id: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> TimerHandle:
        """Run this task with these arguments at ``at`` or after ``delay`` (seconds), once.

        ``id``, ``token``, ``delay`` and ``at`` are the timer's (see
        :meth:`TimerClient.schedule`); every other argument goes to the task.
        Returns once the call is queued; ``registry.client.flush()`` confirms delivery.
        """
        call = self.call(args, kwargs)
        return self.registry.client.schedule(
            self.registry.config.topic, self.name, call.encode(), delay=delay, at=at, id=id, token=token
        )

    async def apply_later_async(
        self,
        *args: Any,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
        id: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> TimerHandle:
        """:meth:`apply_later` for asyncio: returns once the broker acknowledged the call."""
        call = self.call(args, kwargs)
        client = self.registry.async_client
        return await client.schedule(
            self.registry.config.topic, self.name, call.encode(), delay=delay, at=at, id=id, token=token
        )


class TaskRegistry:
    """Named tasks, and the timer clients that schedule their calls (created on first use)."""

    def __init__(
        self,
        config: TaskConfig | None = None,
        *,
        common: CommonConfig | None = None,
        client: TimerClient | None = None,
        async_client: AsyncTimerClient | None = None,
    ) -> None:
        self._config = config
        self._common = common
        self._client = client
        self._async_client = async_client
        self._tasks: dict[str, Task[Any]] = {}

    @property
    def config(self) -> TaskConfig:
        if self._config is None:
            self._config = TaskConfig.from_env()
        return self._config

    @property
    def common(self) -> CommonConfig:
        if self._common is None:
            self._common = CommonConfig.from_env()
        return self._common

    @property
    def client(self) -> TimerClient:
        if self._client is None:
            self._client = TimerClient(self.common)
        return self._client

    @property
    def async_client(self) -> AsyncTimerClient:
        if self._async_client is None:
            self._async_client = AsyncTimerClient(self.common)
        return self._async_client

    def register(
        self, name: str, *, max_retries: int | None = None, backoff_s: float | None = None
    ) -> Callable[[Callable[..., R]], Task[R]]:
        """Decorator: register a function (sync or ``async def``) as task ``name``.

        ``max_retries``/``backoff_s`` override the registry's retry policy for this task.
        """
        if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
            raise TaskError(f"task name {name!r}: use 1-200 letters, digits, '.', '_', ':' or '-'")
        if name in self._tasks:
            raise TaskError(f"task {name!r} is already registered (by {self._tasks[name].fn.__qualname__})")

        def decorate(fn: Callable[..., R]) -> Task[R]:
            retry = self.config.retry
            if max_retries is not None or backoff_s is not None:
                retry = RetryPolicy(
                    max_retries=retry.max_retries if max_retries is None else max_retries,
                    backoff_s=retry.backoff_s if backoff_s is None else backoff_s,
                    multiplier=retry.multiplier,
                    max_backoff_s=retry.max_backoff_s,
                )
                retry.validate()
            task = Task(name, fn, retry, self)
            self._tasks[name] = task
            return task

        return decorate

    def get(self, name: str) -> Task[Any]:
        task = self._tasks.get(name)
        if task is None:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTask(f"no task is registered as {name!r} (registered: {known})")
        return task

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tasks))

    def apply_later(self, name: str, *args: Any, **kwargs: Any) -> TimerHandle:
        """``registry.get(name).apply_later(...)``: refuses a name that is not registered here."""
        return self.get(name).apply_later(*args, **kwargs)

    def close(self) -> None:
        """Flush and close the sync client, if one was created (the async one: ``await aclose()``)."""
        if self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        if self._async_client is not None:
            await self._async_client.close()
