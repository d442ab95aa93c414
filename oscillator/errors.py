"""Errors of the oscillator; missing topics and delivery failures use the shared ones."""

from ktimers.errors import TimersError


class OscillatorError(TimersError):
    """Root of the errors only the oscillator raises."""


class MetadataError(OscillatorError):
    """The brokers did not answer a metadata request in time; the message says what to check."""
