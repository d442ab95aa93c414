"""Errors of the batch jobs: each message says what to do."""

from __future__ import annotations

from ktimers.errors import TimersError


class JobError(TimersError):
    """A job cannot go on; the message names the cause and the fix."""


class SourceError(JobError):
    """Kafka could not be read as planned (missing topic, records gone, timeout)."""


class SnapshotError(JobError):
    """A snapshot is incomplete or does not belong to the topic it is used with."""
