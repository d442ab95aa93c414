"""Delayed tasks: named functions called later through durable timers.

Register functions on a :class:`TaskRegistry`, call ``task.apply_later(...)``;
the task worker (``timers-tasks``, :mod:`futures.tasks.worker`) runs each call
when its timer fires. See :mod:`futures.tasks.registry`.
"""

from futures.tasks.config import RetryPolicy, TaskConfig
from futures.tasks.errors import TaskError, UnknownTask
from futures.tasks.registry import Task, TaskRegistry

__all__ = ["RetryPolicy", "Task", "TaskConfig", "TaskError", "TaskRegistry", "UnknownTask"]
