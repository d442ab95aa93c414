"""Errors of the task layer."""

from __future__ import annotations

from ktimers.errors import TimersError


class TaskError(TimersError):
    """A task cannot be registered or scheduled as asked; the message says why."""


class UnknownTask(TaskError):
    """No task is registered under this name."""
