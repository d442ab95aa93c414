"""Errors of the task layer."""

from __future__ import annotations

from ktimers.errors import TimersError


class TaskError(TimersError):
    """A task cannot be registered or scheduled as asked; the message says why."""


class UnknownTask(TaskError):
    """No task is registered under this name."""


class UnschedulableRetry(TaskError):
    """The retry of a failed call cannot become a timer (e.g. too large to write): it is dead-lettered."""
